//! The Anthropic Messages wire format, both ways.
//!
//! Requests: system messages are lifted into the top-level `system`, tool results
//! become `tool_result` blocks of a user message, and consecutive messages of one
//! role are merged, since the API wants strictly alternating user/assistant turns
//! that start (and, here, end) with a user turn. A reply's thinking blocks are
//! kept whole on its message (`providerOptions`) and sent back before its text
//! and tool calls; reasoning parts alone are not (the API only accepts thinking
//! with the signature it issued). With `prompt_cache`, `cache_control`
//! breakpoints go on the last tool, the system prompt, the end of the shared
//! prefix and the end of the history (at most the API's 4). The effective
//! [`ModelOptions`] become the request's sampling, stop, tool-choice and
//! thinking fields, a native structured output's `output_config.format`,
//! `extra_body` last. A reply cut at `max_tokens` is
//! [`Failure::Truncated`]. See docs/anthropic.md.

mod stream;

use std::collections::HashSet;
use std::sync::Arc;

use arbor_actors::ModelRequest;
use arbor_actors::message::{
    Content, Message, Meta, Part, STEP_PROMPT, TOOL_CALL_ERROR, ToolCall, ToolResultPart,
};
use arbor_actors::model::{ModelOptions, ToolChoice};
use serde_json::{Value, json};

pub(crate) use self::stream::StreamState;
use crate::settings::{DEFAULT_MAX_TOKENS, ProviderKind, ProviderSettings};
use crate::wire::convert::{adjacent_results, result_text};
use crate::wire::{Assembler, Failure, Reply, Tokens, WireFormat};

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

    /// `max_tokens` grows by as much as the configured one would: with a
    /// thinking budget that got the configured length on top, the budget
    /// stays on top of the larger one, so the reply's room is never less
    /// than the first request's.
    fn with_room(&self, body: &mut Value, settings: &ProviderSettings, max_tokens: u32) {
        let configured = settings.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        let sent = body
            .get("max_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(u64::from(configured));
        let more = u64::from(max_tokens.saturating_sub(configured));
        body["max_tokens"] = json!(sent.saturating_add(more));
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

/// Where a block of the request came from, which decides where the cache
/// breakpoints go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// A message of the shared prefix (what the run took from its parent).
    Shared,
    /// One of the run's own messages.
    Own,
    /// The template's step prompt, sent with this request only.
    StepPrompt,
    /// A `(continue)` turn the API needed.
    Filler,
}

/// A turn of the request: its role and its blocks, each with its origin.
struct Turn {
    role: &'static str,
    blocks: Vec<(Value, Origin)>,
}

pub(crate) fn request_body(settings: &ProviderSettings, request: &ModelRequest) -> Value {
    let options = request.meta.options.over(&settings.options);
    let mut system = Vec::new();
    if !request.system_prompt.trim().is_empty() {
        system.push(request.system_prompt.to_string());
    }
    let shared: HashSet<*const Message> = request
        .messages
        .iter()
        .take(request.meta.shared_prefix)
        .map(Arc::as_ptr)
        .collect();
    let mut turns: Vec<Turn> = Vec::new();
    for m in adjacent_results(&request.messages.to_vec()) {
        let origin = if shared.contains(&Arc::as_ptr(&m)) {
            Origin::Shared
        } else if m.has_tag(STEP_PROMPT) {
            Origin::StepPrompt
        } else {
            Origin::Own
        };
        let (role, blocks) = match &*m {
            Message::System { content, .. } => {
                let text = content.text();
                if !text.trim().is_empty() {
                    system.push(text);
                }
                continue;
            }
            Message::User { content, .. } => ("user", user_blocks(content)),
            Message::Assistant { content, meta } => ("assistant", assistant_blocks(content, meta)),
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
        let blocks = blocks.into_iter().map(|b| (b, origin));
        match turns.last_mut() {
            Some(last) if last.role == role => last.blocks.extend(blocks),
            _ => turns.push(Turn {
                role,
                blocks: blocks.collect(),
            }),
        }
    }
    let filler = || Turn {
        role: "user",
        blocks: vec![(text_block(CONTINUE), Origin::Filler)],
    };
    if turns.first().is_none_or(|t| t.role != "user") {
        turns.insert(0, filler());
    }
    // A final assistant turn would be a prefill the model continues in place
    // (and some models refuse); every other provider answers with a new message.
    if turns.last().is_some_and(|t| t.role == "assistant") {
        turns.push(filler());
    }
    if settings.prompt_cache {
        mark_history(&mut turns, request.meta.shared_prefix > 0);
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|t| {
            let blocks = t.blocks.into_iter().map(|(b, _)| b).collect();
            json!({"role": t.role, "content": content_value(blocks)})
        })
        .collect();
    let max_tokens = settings.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let budget = options.reasoning.as_ref().and_then(|r| r.budget_tokens);
    let mut body = json!({
        "model": settings.model,
        // The thinking budget counts against max_tokens and must stay under
        // it: a budget that does not leave room gets the configured length on top.
        "max_tokens": match budget {
            Some(budget) if budget >= max_tokens => budget.saturating_add(max_tokens),
            _ => max_tokens,
        },
    });
    // The order the API builds the prompt (and its cache) in: tools, system,
    // messages; the body keeps it, so equal prefixes are equal bytes too.
    if !request.tools.is_empty() {
        let mut tools: Vec<Value> = request
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
        if settings.prompt_cache
            && let Some(last) = tools.last_mut()
        {
            last["cache_control"] = ephemeral();
        }
        body["tools"] = json!(tools);
    }
    if !system.is_empty() {
        let text = system.join("\n\n");
        body["system"] = if settings.prompt_cache {
            json!([{"type": "text", "text": text, "cache_control": ephemeral()}])
        } else {
            json!(text)
        };
    }
    body["messages"] = json!(messages);
    if settings.stream {
        body["stream"] = json!(true);
    }
    apply_options(&mut body, &options, !request.tools.is_empty());
    body
}

/// A cache breakpoint.
fn ephemeral() -> Value {
    json!({"type": "ephemeral"})
}

/// Whether a block may carry a breakpoint (thinking blocks may not).
fn cacheable(block: &Value) -> bool {
    !matches!(
        block.get("type").and_then(Value::as_str),
        Some("thinking" | "redacted_thinking")
    )
}

/// The history's breakpoints, at most two: on the block that ends the shared
/// prefix as sent (the last block before the first one that is not the
/// prefix's, when `shared`), and on the last block of the run's history (not
/// the step prompt, which the next request will not have there, nor a
/// `(continue)`), so its next step reads what this one wrote.
fn mark_history(turns: &mut [Turn], shared: bool) {
    let positions = || {
        turns.iter().enumerate().flat_map(|(t, turn)| {
            turn.blocks
                .iter()
                .enumerate()
                .map(move |(b, (block, origin))| ((t, b), *origin, cacheable(block)))
        })
    };
    let mut prefix_end = None;
    if shared {
        for (at, origin, cacheable) in positions() {
            match origin {
                Origin::Shared if cacheable => prefix_end = Some(at),
                Origin::Shared | Origin::Filler => {}
                Origin::Own | Origin::StepPrompt => break,
            }
        }
    }
    let history_end = positions()
        .rfind(|(_, origin, cacheable)| {
            *cacheable && matches!(origin, Origin::Shared | Origin::Own)
        })
        .map(|(at, _, _)| at);
    for (t, b) in [prefix_end, history_end].into_iter().flatten() {
        turns[t].blocks[b].0["cache_control"] = ephemeral();
    }
}

/// The request fields of the effective options. `seed` and `reasoning.effort`
/// have no Messages API field and are not sent; `extra_body` goes last.
fn apply_options(body: &mut Value, options: &ModelOptions, has_tools: bool) {
    if let Some(t) = options.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(p) = options.top_p {
        body["top_p"] = json!(p);
    }
    if let Some(stop) = &options.stop {
        body["stop_sequences"] = json!(stop);
    }
    // The API refuses a tool_choice without tools.
    if has_tools {
        let mut choice = match &options.tool_choice {
            Some(ToolChoice::Auto) => Some(json!({"type": "auto"})),
            Some(ToolChoice::Required) => Some(json!({"type": "any"})),
            Some(ToolChoice::None) => Some(json!({"type": "none"})),
            Some(ToolChoice::Tool(name)) => Some(json!({"type": "tool", "name": name})),
            None => None,
        };
        // `{"type": "none"}` takes no other field.
        let calls_allowed = options.tool_choice != Some(ToolChoice::None);
        if options.parallel_tool_calls == Some(false) && calls_allowed {
            choice.get_or_insert_with(|| json!({"type": "auto"}))["disable_parallel_tool_use"] =
                json!(true);
        }
        if let Some(choice) = choice {
            body["tool_choice"] = choice;
        }
    }
    if let Some(budget) = options.reasoning.as_ref().and_then(|r| r.budget_tokens) {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
    }
    // A native structured output: the schema as the reply's format (generally
    // available on the models that have structured outputs, no beta header;
    // the others refuse the field, so a template's `auto` picks the tool here).
    if let Some(format) = &options.output {
        body["output_config"] = json!({"format": {
            "type": "json_schema",
            "schema": format.schema.source(),
        }});
    }
    if let Some(extra) = &options.extra_body {
        for (key, value) in extra {
            body[key.as_str()] = value.clone();
        }
    }
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

/// An assistant message's blocks: the thinking blocks its reply had, as the
/// API sent them (kept in `providerOptions`, see [`THINKING`]), then its text
/// and tool calls. Thinking alone is not sent: it answers nothing.
fn assistant_blocks(content: &Content, meta: &Meta) -> Vec<Value> {
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
                        "input": tool_input(&call.input.value()),
                    })),
                    // Reasoning goes back as the kept thinking blocks (the API
                    // takes them only with their signature); media cannot be in
                    // an assistant turn.
                    Part::Reasoning { .. } | Part::Image { .. } | Part::File { .. } => {}
                }
            }
        }
    }
    if blocks.is_empty() {
        return blocks;
    }
    let mut thinking = kept_thinking(meta);
    thinking.extend(blocks);
    thinking
}

/// Where a reply's thinking blocks are kept in its message's
/// `providerOptions`: `{"anthropic": {"thinking": [BLOCK, ...]}}`.
pub(crate) const THINKING: &str = "/anthropic/thinking";

/// The thinking and redacted-thinking blocks kept on a message, in order.
fn kept_thinking(meta: &Meta) -> Vec<Value> {
    meta.provider_options
        .as_ref()
        .and_then(|o| o.pointer(THINKING))
        .and_then(Value::as_array)
        .map(|blocks| blocks.iter().filter(|b| !cacheable(b)).cloned().collect())
        .unwrap_or_default()
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
    /// Thinking and the signature the API issued for it (none: it cannot be
    /// sent back).
    Thinking {
        text: String,
        signature: Option<String>,
    },
    /// Encrypted thinking: its `data`, sent back as it came.
    Redacted(String),
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
            Some("thinking") => Block::Thinking {
                text: text("thinking"),
                signature: block
                    .get("signature")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            },
            Some("redacted_thinking") => Block::Redacted(text("data")),
            Some("tool_use") => Block::ToolUse(ToolCall {
                tool_call_id: text("id"),
                tool_name: text("name"),
                input: block
                    .get("input")
                    .cloned()
                    .unwrap_or_else(|| json!({}))
                    .into(),
            }),
            _ => Block::Other,
        }
    }
}

/// The assistant message of a reply's blocks, in order; adjacent text (or
/// thinking) blocks are one part, empty ones none. Signed thinking and
/// redacted thinking blocks are also kept whole, in order, in the message's
/// `providerOptions` ([`THINKING`]): the next request sends them back.
fn assistant(blocks: impl IntoIterator<Item = Block>) -> Message {
    let mut parts: Vec<Part> = Vec::new();
    let mut kept: Vec<Value> = Vec::new();
    for block in blocks {
        match &block {
            Block::Thinking {
                text,
                signature: Some(signature),
            } => kept.push(json!({"type": "thinking", "thinking": text, "signature": signature})),
            Block::Redacted(data) => kept.push(json!({"type": "redacted_thinking", "data": data})),
            _ => {}
        }
        match (block, parts.last_mut()) {
            (Block::Text(more), Some(Part::Text { text })) => text.push_str(&more),
            (Block::Thinking { text: more, .. }, Some(Part::Reasoning { text })) => {
                text.push_str(&more)
            }
            (Block::Text(text), _) if !text.is_empty() => parts.push(Part::Text { text }),
            (Block::Thinking { text, .. }, _) if !text.is_empty() => {
                parts.push(Part::Reasoning { text })
            }
            (Block::ToolUse(call), _) => parts.push(Part::ToolCall(call)),
            _ => {}
        }
    }
    let mut meta = Meta::default();
    if !kept.is_empty() {
        meta.provider_options = Some(json!({"anthropic": {"thinking": kept}}));
    }
    Message::Assistant {
        content: Content::Parts(parts),
        meta,
    }
}

/// The failure of a reply cut at `max_tokens`: its text or tool call may be
/// incomplete, so it is never acted on.
fn truncated(tokens: &Tokens) -> Failure {
    Failure::Truncated(
        format!(
            "stop_reason max_tokens after {} output tokens (raise max_tokens)",
            tokens.output
        ),
        *tokens,
    )
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
    let mut tokens = Tokens::default();
    if let Some(usage) = body.get("usage") {
        update_tokens(&mut tokens, usage);
    }
    if body.get("stop_reason").and_then(Value::as_str) == Some("max_tokens") {
        return Err(truncated(&tokens));
    }
    Ok(Reply {
        message: assistant(content.iter().map(Block::from_json)),
        tokens,
    })
}

#[cfg(test)]
mod tests;

//! The OpenAI Responses wire format (`POST /responses`), both ways.
//!
//! Requests: the system prompt is `instructions`; the history becomes `input`
//! items (user and assistant messages, `function_call` and
//! `function_call_output` items, and the reasoning items the model issued);
//! `store: false` with `include: ["reasoning.encrypted_content"]`, so nothing is
//! kept server-side and a reasoning item comes back whole, to be sent again.
//!
//! Reasoning items: a reply's `{"type": "reasoning", "id", "encrypted_content",
//! "summary"}` items are kept on its assistant message: one [`Part::Reasoning`]
//! per item, at the item's place among the text and calls (its text the
//! summary's, empty when there is none), and the items themselves, in the same
//! order, in `providerOptions.openai.reasoning` (the message's stored form, so
//! they survive a checkpoint). The n-th reasoning part goes back as the n-th
//! item, where the part is; an item without `encrypted_content` (which
//! `store: false` cannot resolve) and a reasoning part without an item (a reply
//! of another API) are not sent.

mod stream;

use arbor_actors::ModelRequest;
use arbor_actors::message::{Content, Message, Meta, Part, ToolCall, ToolResultPart};
use arbor_actors::model::{ModelOptions, ToolChoice};
use serde_json::{Map, Value, json};

pub(crate) use self::stream::StreamState;
use crate::settings::{ProviderKind, ProviderSettings};
use crate::wire::convert::{adjacent_results, arguments, result_text};
use crate::wire::{Assembler, Failure, Reply, Tokens, WireFormat};

/// The Responses API.
pub(crate) struct Responses;

impl WireFormat for Responses {
    fn kind(&self) -> ProviderKind {
        ProviderKind::OpenAi
    }

    fn path(&self) -> &'static str {
        "/responses"
    }

    fn auth_header(&self, key: &str) -> (&'static str, String) {
        ("authorization", format!("Bearer {key}"))
    }

    fn request_body(&self, settings: &ProviderSettings, request: &ModelRequest) -> Value {
        request_body(settings, request)
    }

    fn with_room(&self, body: &mut Value, _settings: &ProviderSettings, max_tokens: u32) {
        body["max_output_tokens"] = json!(max_tokens);
    }

    fn parse_response(&self, body: &Value) -> Result<Reply, Failure> {
        parse_response(body)
    }

    fn assembler(&self) -> Box<dyn Assembler> {
        Box::new(StreamState::default())
    }
}

pub(crate) fn request_body(settings: &ProviderSettings, request: &ModelRequest) -> Value {
    let mut input = Vec::new();
    for m in adjacent_results(&request.messages.to_vec()) {
        push_items(&mut input, &m);
    }
    let mut body = json!({
        "model": settings.model,
        "input": input,
        "store": false,
        "include": ["reasoning.encrypted_content"],
    });
    if !request.system_prompt.is_empty() {
        body["instructions"] = json!(&*request.system_prompt);
    }
    if let Some(max) = settings.max_tokens {
        body["max_output_tokens"] = json!(max);
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|(name, def)| {
                // Functions are strict unless told otherwise here, and strict
                // mode refuses most hand-written schemas.
                json!({
                    "type": "function",
                    "name": name,
                    "description": def.description,
                    "parameters": def.input_schema,
                    "strict": false,
                })
            })
            .collect();
        body["tools"] = json!(tools);
    }
    let options = request.meta.options.over(&settings.options);
    apply_options(&mut body, &options, !request.tools.is_empty());
    if settings.stream {
        body["stream"] = json!(true);
    }
    body
}

/// The options the Responses API has (it has no `stop` and no `seed`: those
/// are not sent), then `extra_body` over everything.
fn apply_options(body: &mut Value, options: &ModelOptions, with_tools: bool) {
    if let Some(t) = options.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(p) = options.top_p {
        body["top_p"] = json!(p);
    }
    // Tool choice means nothing (and `required` is refused) without tools.
    if with_tools {
        if let Some(choice) = &options.tool_choice {
            body["tool_choice"] = match choice {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::Required => json!("required"),
                ToolChoice::None => json!("none"),
                ToolChoice::Tool(name) => json!({"type": "function", "name": name}),
            };
        }
        if let Some(parallel) = options.parallel_tool_calls {
            body["parallel_tool_calls"] = json!(parallel);
        }
    }
    if let Some(effort) = options.reasoning.as_ref().and_then(|r| r.effort) {
        body["reasoning"] = json!({"effort": effort.name()});
    }
    // A native structured output: the schema as the text's format, strict
    // only when it fits the strict subset.
    if let Some(format) = &options.output {
        body["text"] = json!({"format": {
            "type": "json_schema",
            "name": format.name,
            "schema": format.schema.source(),
            "strict": format.strict,
        }});
    }
    if let Some(extra) = &options.extra_body
        && let Some(body) = body.as_object_mut()
    {
        body.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
}

/// The input items of one history message.
fn push_items(input: &mut Vec<Value>, m: &Message) {
    match m {
        Message::System { content, .. } => {
            let text = content.text();
            if !text.trim().is_empty() {
                input.push(json!({"role": "system", "content": [input_text(&text)]}));
            }
        }
        Message::User { content, .. } => {
            let parts = user_content(content);
            if !parts.is_empty() {
                input.push(json!({"role": "user", "content": parts}));
            }
        }
        Message::Assistant { content, meta } => assistant_items(input, content, meta),
        Message::Tool {
            tool_call_id,
            content,
            ..
        } => input.push(json!({
            "type": "function_call_output",
            "call_id": tool_call_id,
            "output": tool_output(content),
        })),
    }
}

fn input_text(text: &str) -> Value {
    json!({"type": "input_text", "text": text})
}

fn user_content(content: &Content) -> Vec<Value> {
    let parts = match content {
        Content::Text(text) => return vec![input_text(text)],
        Content::Parts(parts) => parts,
    };
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } => Some(input_text(text)),
            Part::Image { image, media_type } => Some(input_image(
                image,
                media_type.as_deref().unwrap_or("image/png"),
            )),
            Part::File {
                data,
                filename,
                media_type,
            } => Some(input_file(data, filename.as_deref(), media_type)),
            Part::Reasoning { .. } | Part::ToolCall(_) => None,
        })
        .collect()
}

fn input_image(data: &str, media_type: &str) -> Value {
    json!({"type": "input_image", "image_url": data_url(data, media_type), "detail": "auto"})
}

fn input_file(data: &str, filename: Option<&str>, media_type: &str) -> Value {
    if is_url(data) {
        return json!({"type": "input_file", "file_url": data});
    }
    json!({
        "type": "input_file",
        "filename": filename.unwrap_or("file"),
        "file_data": data_url(data, media_type),
    })
}

fn is_url(data: &str) -> bool {
    data.starts_with("http://") || data.starts_with("https://")
}

/// A URL as is, or base64 data as a `data:` URL.
fn data_url(data: &str, media_type: &str) -> String {
    if is_url(data) || data.starts_with("data:") {
        data.to_owned()
    } else {
        format!("data:{media_type};base64,{data}")
    }
}

/// A tool result's `output`: its text, or, with media, a list of content
/// parts (images and PDFs as such, other media as a note).
fn tool_output(content: &[ToolResultPart]) -> Value {
    let text = result_text(content);
    if !content
        .iter()
        .any(|p| matches!(p, ToolResultPart::Media { .. }))
    {
        return json!(text);
    }
    let mut parts = Vec::new();
    if !text.is_empty() {
        parts.push(input_text(&text));
    }
    for part in content {
        if let ToolResultPart::Media { data, media_type } = part {
            parts.push(if media_type.starts_with("image/") {
                input_image(data, media_type)
            } else if media_type == "application/pdf" {
                input_file(data, Some("attachment.pdf"), media_type)
            } else {
                input_text(&format!(
                    "[{media_type} attachment omitted: not supported in tool results]"
                ))
            });
        }
    }
    json!(parts)
}

/// An assistant message's items in its parts' order: its text as a message,
/// each call as a `function_call`, each reasoning part as the reasoning item
/// it came with.
fn assistant_items(input: &mut Vec<Value>, content: &Content, meta: &Meta) {
    let parts = match content {
        Content::Text(text) => {
            push_output_text(input, text);
            return;
        }
        Content::Parts(parts) => parts,
    };
    let mut items = reasoning_items(meta).into_iter();
    let mut text: Vec<&str> = Vec::new();
    let flush = |input: &mut Vec<Value>, text: &mut Vec<&str>| {
        if !text.is_empty() {
            push_output_text(input, &text.join("\n"));
            text.clear();
        }
    };
    for part in parts {
        match part {
            Part::Text { text: t } => text.push(t),
            Part::Reasoning { .. } => {
                flush(input, &mut text);
                if let Some(item) = items.next().and_then(reasoning_input) {
                    input.push(item);
                }
            }
            Part::ToolCall(call) => {
                flush(input, &mut text);
                input.push(json!({
                    "type": "function_call",
                    "call_id": call.tool_call_id,
                    "name": call.tool_name,
                    "arguments": call.input.arguments(),
                }));
            }
            Part::Image { .. } | Part::File { .. } => {}
        }
    }
    flush(input, &mut text);
}

fn push_output_text(input: &mut Vec<Value>, text: &str) {
    if !text.trim().is_empty() {
        input.push(json!({
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        }));
    }
}

/// The reasoning items a message keeps, in order.
fn reasoning_items(meta: &Meta) -> Vec<Value> {
    meta.provider_options
        .as_ref()
        .and_then(|o| o.pointer("/openai/reasoning"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// A kept reasoning item as an input item; `None` without encrypted content.
fn reasoning_input(item: Value) -> Option<Value> {
    let encrypted = item
        .get("encrypted_content")
        .and_then(Value::as_str)
        .filter(|e| !e.is_empty())?;
    Some(json!({
        "type": "reasoning",
        "id": item.get("id").cloned().unwrap_or(Value::Null),
        "encrypted_content": encrypted,
        "summary": item.get("summary").cloned().unwrap_or_else(|| json!([])),
    }))
}

/// The part of a reasoning item that is kept (and sent back).
fn kept_reasoning(item: &Value) -> Value {
    let mut kept = Map::new();
    for key in ["id", "encrypted_content", "summary"] {
        if let Some(v) = item.get(key).filter(|v| !v.is_null()) {
            kept.insert(key.to_owned(), v.clone());
        }
    }
    kept.entry("summary").or_insert_with(|| json!([]));
    Value::Object(kept)
}

/// The readable text of a reasoning item: its summary, or (servers that show
/// the reasoning itself, e.g. gpt-oss behind vLLM) its `reasoning_text`.
fn reasoning_text(item: &Value) -> String {
    let texts = |key: &str, kind: &str| -> Vec<String> {
        item.get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some(kind))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let summary = texts("summary", "summary_text");
    if summary.is_empty() {
        texts("content", "reasoning_text").join("\n\n")
    } else {
        summary.join("\n\n")
    }
}

/// The text of a `message` output item (refusals as text).
fn message_text(item: &Value) -> String {
    item.get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| match p.get("type").and_then(Value::as_str) {
            Some("output_text") => p.get("text").and_then(Value::as_str),
            Some("refusal") => p.get("refusal").and_then(Value::as_str),
            _ => None,
        })
        .collect()
}

/// The assistant message of a reply's output items, in order.
pub(crate) fn assistant<'a>(output: impl IntoIterator<Item = &'a Value>) -> Message {
    let mut parts = Vec::new();
    let mut reasoning = Vec::new();
    for item in output {
        let text = |key: &str| {
            item.get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let text = message_text(item);
                if !text.is_empty() {
                    parts.push(Part::Text { text });
                }
            }
            Some("function_call") => parts.push(Part::ToolCall(ToolCall {
                tool_call_id: text("call_id"),
                tool_name: text("name"),
                input: arguments(&text("arguments")).into(),
            })),
            Some("reasoning") => {
                parts.push(Part::Reasoning {
                    text: reasoning_text(item),
                });
                reasoning.push(kept_reasoning(item));
            }
            _ => {}
        }
    }
    let provider_options =
        (!reasoning.is_empty()).then(|| json!({"openai": {"reasoning": reasoning}}));
    Message::Assistant {
        content: Content::Parts(parts),
        meta: Meta {
            provider_options,
            ..Meta::default()
        },
    }
}

pub(crate) fn tokens(usage: &Value) -> Tokens {
    let n = |p: &str| usage.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let cached = n("/input_tokens_details/cached_tokens");
    Tokens {
        input: n("/input_tokens").saturating_sub(cached),
        output: n("/output_tokens"),
        cache_read: cached,
        cache_write: 0,
        reported: true,
    }
}

/// An error object (a failed response's `error`, an `error` event, an error
/// body sent with status 200): by its `code`, worth another attempt or not.
pub(crate) fn api_error(error: &Value) -> Failure {
    let code = error.get("code").and_then(Value::as_str);
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| error.as_str())
        .unwrap_or("the server reported an error");
    let message = match code {
        Some(code) => format!("{message} ({code})"),
        None => message.to_owned(),
    };
    match code {
        Some("rate_limit_exceeded") => Failure::Transient {
            status: Some(429),
            message,
            retry_after: None,
        },
        None | Some("server_error" | "vector_store_timeout") => Failure::transient(message),
        // The other documented codes are about the request (an invalid
        // prompt, image or file).
        Some(_) => Failure::Rejected {
            status: 400,
            message,
        },
    }
}

/// A whole response object (a non-streamed reply, or the one a stream's last
/// event carries) with these output items.
pub(crate) fn reply(response: &Value, output: &[Value]) -> Result<Reply, Failure> {
    match response.get("status").and_then(Value::as_str) {
        Some("failed") => {
            let error = response.get("error").filter(|e| !e.is_null());
            return Err(error.map_or_else(|| Failure::transient("the response failed"), api_error));
        }
        Some("incomplete") => {
            let reason = response
                .pointer("/incomplete_details/reason")
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            if reason == "max_output_tokens" {
                // Billed all the same: its usage is counted.
                let billed = response.get("usage").filter(|u| !u.is_null());
                return Err(Failure::Truncated(
                    "the response is incomplete: it reached max_output_tokens".into(),
                    billed.map(tokens).unwrap_or_default(),
                ));
            }
            // A content filter ends the reply where it is: what came is the reply.
            tracing::debug!(reason, "the response is incomplete");
        }
        _ => {}
    }
    Ok(Reply {
        message: assistant(output),
        tokens: response
            .get("usage")
            .filter(|u| !u.is_null())
            .map(tokens)
            .unwrap_or_default(),
    })
}

pub(crate) fn parse_response(body: &Value) -> Result<Reply, Failure> {
    if let Some(error) = body.get("error").filter(|e| !e.is_null()) {
        return Err(api_error(error));
    }
    let output = body
        .get("output")
        .and_then(Value::as_array)
        .ok_or_else(|| Failure::Malformed("reply has no output array".into()))?;
    reply(body, output)
}

#[cfg(test)]
mod tests;

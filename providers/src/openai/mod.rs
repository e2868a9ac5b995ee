//! The OpenAI Chat Completions wire format, both ways, for OpenAI and the
//! servers compatible with it (vLLM, llama.cpp, Ollama, LiteLLM, OpenRouter).
//! What each field is and the servers' quirks it works around are in
//! `docs/providers.md`.

mod stream;

use arbor_actors::ModelRequest;
use arbor_actors::message::{Content, Message, Part, ToolCall, ToolResultPart};
use arbor_actors::model::{ModelOptions, OutputFormat, ToolChoice};
use serde_json::{Value, json};

pub(crate) use self::stream::StreamState;
use crate::settings::{ProviderKind, ProviderSettings};
use crate::wire::convert::{adjacent_results, arguments, result_text};
use crate::wire::{Assembler, Failure, Reply, Tokens, WireFormat};

/// The Chat Completions API (OpenAI and the servers compatible with it).
pub(crate) struct OpenAi;

impl WireFormat for OpenAi {
    fn kind(&self) -> ProviderKind {
        ProviderKind::OpenAi
    }

    fn path(&self) -> &'static str {
        "/chat/completions"
    }

    fn auth_header(&self, key: &str) -> (&'static str, String) {
        ("authorization", format!("Bearer {key}"))
    }

    fn request_body(&self, settings: &ProviderSettings, request: &ModelRequest) -> Value {
        request_body(settings, request)
    }

    fn with_room(&self, body: &mut Value, settings: &ProviderSettings, max_tokens: u32) {
        body[max_tokens_field(&settings.base_url)] = json!(max_tokens);
    }

    fn parse_response(&self, body: &Value) -> Result<Reply, Failure> {
        parse_response(body)
    }

    fn assembler(&self) -> Box<dyn Assembler> {
        Box::new(StreamState::default())
    }
}

pub(crate) fn request_body(settings: &ProviderSettings, request: &ModelRequest) -> Value {
    let options = request.meta.options.over(&settings.options);
    let mut messages = Vec::new();
    if !request.system_prompt.is_empty() {
        messages.push(json!({"role": "system", "content": &*request.system_prompt}));
    }
    for m in adjacent_results(&request.messages.to_vec()) {
        // An assistant message with neither text nor calls (reasoning only) has
        // nothing to send, and `content: null` without `tool_calls` is refused.
        if m.is_assistant() && m.tool_calls().next().is_none() && m.text().is_empty() {
            continue;
        }
        messages.push(message(&m));
    }
    let mut body = json!({
        "model": settings.model,
        "messages": messages,
    });
    if let Some(max) = settings.max_tokens {
        body[max_tokens_field(&settings.base_url)] = json!(max);
    }
    sampling(&mut body, &options);
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
        // Always said: llama.cpp's server reads a request without
        // `tool_choice` as one with no tools (OpenAI's default is `auto`).
        body["tool_choice"] =
            tool_choice(options.tool_choice.as_ref().unwrap_or(&ToolChoice::Auto));
        // Without tools both fields are refused (OpenAI, vLLM): sent only here.
        if let Some(parallel) = options.parallel_tool_calls {
            body["parallel_tool_calls"] = json!(parallel);
        }
    }
    if let Some(effort) = options.reasoning.as_ref().and_then(|r| r.effort) {
        body["reasoning_effort"] = json!(effort.name());
    }
    if let Some(format) = &options.output {
        body["response_format"] = response_format(format);
    }
    if settings.stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    // The last word: its keys replace the ones set above.
    if let (Some(extra), Some(object)) = (&options.extra_body, body.as_object_mut()) {
        object.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    body
}

/// The field the reply's token limit goes in: `max_completion_tokens` for
/// OpenAI's own API (its reasoning models refuse `max_tokens`, which it
/// deprecated), `max_tokens` for every other server (vLLM, llama.cpp, Ollama
/// and most proxies read only that one).
pub(crate) fn max_tokens_field(base_url: &str) -> &'static str {
    let host = reqwest::Url::parse(base_url)
        .ok()
        .and_then(|url| url.host_str().map(str::to_ascii_lowercase));
    match host {
        Some(host) if host == "api.openai.com" || host.ends_with(".api.openai.com") => {
            "max_completion_tokens"
        }
        _ => "max_tokens",
    }
}

/// A native structured output's `response_format`: the output schema as a
/// `json_schema`, strict only when the schema fits the strict subset (strict
/// mode refuses any other schema). vLLM, llama.cpp's server and Ollama's
/// `/v1` read the same field; a server that wants another one (vLLM's older
/// `guided_json`) gets it through `extra_body`.
pub(crate) fn response_format(format: &OutputFormat) -> Value {
    json!({"type": "json_schema", "json_schema": {
        "name": format.name,
        "schema": format.schema.source(),
        "strict": format.strict,
    }})
}

/// The sampling fields that are set.
fn sampling(body: &mut Value, options: &ModelOptions) {
    if let Some(t) = options.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(p) = options.top_p {
        body["top_p"] = json!(p);
    }
    if let Some(stop) = &options.stop {
        body["stop"] = json!(stop);
    }
    if let Some(seed) = options.seed {
        body["seed"] = json!(seed);
    }
}

fn tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::Required => json!("required"),
        ToolChoice::None => json!("none"),
        ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
    }
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
                        "arguments": c.input.arguments()
                    }})
                })
                .collect();
            // Never `content: null`: Ollama ("invalid message content type:
            // <nil>") and llama.cpp ("Invalid 'content' type", and before its
            // tool support "Missing 'content'") refuse it; every server takes a
            // string, and OpenAI takes `""` beside `tool_calls`.
            let mut out = json!({"role": "assistant", "content": text});
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
        reported: true,
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

/// An `error` object sent with status 200 (some compatible servers do).
fn error_failure(error: &Value) -> Failure {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| error.as_str())
        .unwrap_or("the server reported an error");
    Failure::transient(message.to_owned())
}

/// The reasoning text of a message or delta: `reasoning_content` (DeepSeek, vLLM)
/// or `reasoning` (OpenRouter, Ollama).
fn reasoning(value: &Value) -> Option<&str> {
    ["reasoning_content", "reasoning"]
        .iter()
        .find_map(|key| value.get(key).and_then(Value::as_str))
        .filter(|t| !t.is_empty())
}

/// A reply that ended with `finish_reason: "length"`: cut at the output limit
/// (`max_tokens`, or the context window on some servers), so its text may
/// stop mid-sentence and its last tool call's arguments mid-value. It is never
/// acted on.
fn truncated(calls: &[ToolCall], tokens: &Tokens) -> Failure {
    let mut message = String::from("finish_reason \"length\"");
    if tokens.reported {
        message.push_str(&format!(" after {} output tokens", tokens.output));
    }
    match calls.last() {
        Some(call) if call.tool_name.is_empty() => {
            message.push_str(", in the middle of a tool call (not run)")
        }
        Some(call) => message.push_str(&format!(
            ", in a call to `{}` whose arguments may be incomplete (not run)",
            call.tool_name
        )),
        None => message.push_str(", its text may be incomplete"),
    }
    message.push_str("; raise max_tokens or ask for a shorter reply");
    Failure::Truncated(message, *tokens)
}

pub(crate) fn parse_response(body: &Value) -> Result<Reply, Failure> {
    if let Some(error) = body.get("error").filter(|e| !e.is_null()) {
        return Err(error_failure(error));
    }
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
    let calls: Vec<ToolCall> = message
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
                    )
                    .into(),
                })
                .collect()
        })
        .unwrap_or_default();
    let tokens = body
        .get("usage")
        .filter(|u| !u.is_null())
        .map(tokens)
        .unwrap_or_default();
    if body
        .pointer("/choices/0/finish_reason")
        .and_then(Value::as_str)
        == Some("length")
    {
        return Err(truncated(&calls, &tokens));
    }
    Ok(Reply {
        message: assistant(
            reasoning(message).unwrap_or_default().to_owned(),
            content,
            calls,
        ),
        tokens,
    })
}

#[cfg(test)]
mod tests;

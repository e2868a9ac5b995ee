//! Messages of an agent's conversation, in the JSON wire format of semantics §2.
//!
//! The names are exact so a Codebuff-shaped state loads and a stored Arbor state
//! can be read by other tools; unknown fields are ignored on input.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Bytes per token of Arbor's one token estimate (`Message::estimated_tokens`,
/// `History::estimated_tokens`), used wherever a count is not reported: a
/// rough average for English text and code in BPE tokenizers.
pub const ESTIMATED_BYTES_PER_TOKEN: u64 = 4;

/// One message of a conversation, tagged by `role`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// Instructions to the model (text parts only).
    System {
        /// The body.
        content: Content,
        /// The optional fields.
        #[serde(flatten)]
        meta: Meta,
    },
    /// A prompt (text, image and file parts).
    User {
        /// The body.
        content: Content,
        /// The optional fields.
        #[serde(flatten)]
        meta: Meta,
    },
    /// A model reply (text, reasoning and tool-call parts).
    Assistant {
        /// The body.
        content: Content,
        /// The optional fields.
        #[serde(flatten)]
        meta: Meta,
    },
    /// The result of one tool call.
    Tool {
        /// The id of the call it answers.
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        /// The tool's wire name, as the model called it.
        #[serde(rename = "toolName")]
        tool_name: String,
        /// The result.
        content: Vec<ToolResultPart>,
        /// The optional fields.
        #[serde(flatten)]
        meta: Meta,
    },
}

/// A message body: a plain string or a list of typed parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// A plain string.
    Text(String),
    /// Typed parts, in order.
    Parts(Vec<Part>),
}

/// A typed part of a message body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Part {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's reasoning, as it reported it.
    Reasoning {
        /// The reasoning text.
        text: String,
    },
    /// An image.
    Image {
        /// An `http(s):` or `data:` URL, or base64 data.
        image: String,
        /// Its media type (`None`: providers assume `image/png`).
        #[serde(rename = "mediaType", default, skip_serializing_if = "Option::is_none")]
        media_type: Option<String>,
    },
    /// A file (e.g. a PDF).
    File {
        /// An `http(s):` or `data:` URL, or base64 data.
        data: String,
        /// Its name, if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filename: Option<String>,
        /// Its media type.
        #[serde(rename = "mediaType")]
        media_type: String,
    },
    /// A tool call (assistant messages only).
    ToolCall(ToolCall),
}

/// A request by the model to run one tool; answered by the tool message with the same id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, unique in the history (semantics §3).
    #[serde(rename = "toolCallId")]
    pub tool_call_id: String,
    /// The tool's wire name.
    #[serde(rename = "toolName")]
    pub tool_name: String,
    /// The tool's input (`null` if the model sent none), as JSON text.
    #[serde(default)]
    pub input: ToolInput,
}

/// A tool call's input, held as compact JSON text and parsed when read
/// ([`ToolInput::value`]). A history keeps a reply for the run's life, and
/// a wide spawn call's input is an object per child: ~540 bytes each
/// parsed, about its text's length as text (the 10^8-agent tree's parents
/// hold ~10^7 at once: issue 34). It reads and writes as the JSON value it
/// is: the wire shape of a tool call is unchanged.
#[derive(Clone, PartialEq, Eq)]
pub struct ToolInput(Box<str>);

impl ToolInput {
    /// The input `value`.
    pub fn new(value: &Value) -> Self {
        ToolInput(value.to_string().into_boxed_str())
    }

    /// The input as a JSON value.
    pub fn value(&self) -> Value {
        // Always valid: it was written from a value.
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }

    /// The input as compact JSON text.
    pub fn text(&self) -> &str {
        &self.0
    }

    /// The input read as a `T`.
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> serde_json::Result<T> {
        serde_json::from_str(&self.0)
    }

    /// The input as a Chat Completions `arguments` string: the text itself
    /// when the model sent its arguments as a string (JSON or not), else
    /// the JSON text.
    pub fn arguments(&self) -> String {
        match self.parse::<String>() {
            Ok(text) if self.0.starts_with('"') => text,
            _ => self.0.to_string(),
        }
    }

    /// Whether the input is `null` (the model sent none).
    pub fn is_null(&self) -> bool {
        &*self.0 == "null"
    }
}

impl Default for ToolInput {
    /// `null`.
    fn default() -> Self {
        ToolInput("null".into())
    }
}

impl From<Value> for ToolInput {
    fn from(value: Value) -> Self {
        ToolInput::new(&value)
    }
}

impl From<&Value> for ToolInput {
    fn from(value: &Value) -> Self {
        ToolInput::new(value)
    }
}

impl PartialEq<Value> for ToolInput {
    fn eq(&self, other: &Value) -> bool {
        self.value() == *other
    }
}

impl std::fmt::Debug for ToolInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for ToolInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for ToolInput {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Written as the JSON it is, not as a string.
        let raw: &serde_json::value::RawValue =
            serde_json::from_str(&self.0).map_err(serde::ser::Error::custom)?;
        raw.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ToolInput {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(ToolInput::from)
    }
}

/// A part of a tool result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ToolResultPart {
    /// A JSON value (a text result is a JSON string).
    Json {
        /// The value.
        value: Value,
    },
    /// Media, such as an image a tool returned.
    Media {
        /// Base64 data.
        data: String,
        /// Its media type.
        #[serde(rename = "mediaType")]
        media_type: String,
    },
}

/// When a message expires (semantics §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeToLive {
    /// `agentStep`: removed when the next step starts.
    #[serde(rename = "agentStep")]
    AgentStep,
    /// `userPrompt`: removed when the turn ends.
    #[serde(rename = "userPrompt")]
    UserPrompt,
}

/// The optional fields every message may carry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Markers such as [`TOOL_CALL_ERROR`] or [`SPAWN_PROMPT`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// When the message expires (`None`: never).
    #[serde(
        rename = "timeToLive",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub time_to_live: Option<TimeToLive>,
    /// Whether truncation must keep the message (`None`: it may drop it).
    #[serde(
        rename = "keepDuringTruncation",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub keep_during_truncation: Option<bool>,
    /// Options passed through to the provider as they are.
    #[serde(
        rename = "providerOptions",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_options: Option<Value>,
    /// When the message was sent, in milliseconds since the Unix epoch.
    #[serde(rename = "sentAt", default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<f64>,
}

/// Tag on error results the model can read (semantics §4.3).
pub const TOOL_CALL_ERROR: &str = "TOOL_CALL_ERROR";
/// Tag on the user message that tells a child it was spawned (semantics §6).
pub const SUBAGENT_SPAWN: &str = "SUBAGENT_SPAWN";
/// Tag on the child's prompt message, so an inline merge can drop it.
pub const SPAWN_PROMPT: &str = "SPAWN_PROMPT";
/// Tag on a template's instructions message, added after the prompt.
pub const INSTRUCTIONS_PROMPT: &str = "INSTRUCTIONS_PROMPT";
/// Tag on a template's step prompt, added to each request (never stored).
pub const STEP_PROMPT: &str = "STEP_PROMPT";

impl Message {
    /// A user message with this text.
    pub fn user(text: impl Into<String>) -> Self {
        Message::User {
            content: Content::Text(text.into()),
            meta: Meta::default(),
        }
    }

    /// A system message with this text.
    pub fn system(text: impl Into<String>) -> Self {
        Message::System {
            content: Content::Text(text.into()),
            meta: Meta::default(),
        }
    }

    /// An assistant message with this text and no tool call.
    pub fn assistant_text(text: impl Into<String>) -> Self {
        Message::Assistant {
            content: Content::Text(text.into()),
            meta: Meta::default(),
        }
    }

    /// An assistant message with optional text followed by tool calls, in order.
    pub fn assistant(text: Option<String>, calls: Vec<ToolCall>) -> Self {
        let mut parts: Vec<Part> = text.into_iter().map(|text| Part::Text { text }).collect();
        parts.extend(calls.into_iter().map(Part::ToolCall));
        Message::Assistant {
            content: Content::Parts(parts),
            meta: Meta::default(),
        }
    }

    /// A tool result holding one JSON value.
    pub fn tool_result(call: &ToolCall, value: Value) -> Self {
        Message::Tool {
            tool_call_id: call.tool_call_id.clone(),
            tool_name: call.tool_name.clone(),
            content: vec![ToolResultPart::Json { value }],
            meta: Meta::default(),
        }
    }

    /// A tool result with these parts (a tool's JSON value, text, media).
    pub(crate) fn tool_output(call: &ToolCall, content: Vec<ToolResultPart>) -> Self {
        Message::Tool {
            tool_call_id: call.tool_call_id.clone(),
            tool_name: call.tool_name.clone(),
            content,
            meta: Meta::default(),
        }
    }

    /// A tool result the model can read as an error, tagged `TOOL_CALL_ERROR`.
    pub fn tool_error(call: &ToolCall, message: impl Into<String>) -> Self {
        let mut msg =
            Self::tool_result(call, serde_json::json!({ "errorMessage": message.into() }));
        msg.meta_mut().tags.push(TOOL_CALL_ERROR.to_owned());
        msg
    }

    /// The `role` tag: `system`, `user`, `assistant` or `tool`.
    pub fn role(&self) -> &'static str {
        match self {
            Message::System { .. } => "system",
            Message::User { .. } => "user",
            Message::Assistant { .. } => "assistant",
            Message::Tool { .. } => "tool",
        }
    }

    /// The optional fields.
    pub fn meta(&self) -> &Meta {
        match self {
            Message::System { meta, .. }
            | Message::User { meta, .. }
            | Message::Assistant { meta, .. }
            | Message::Tool { meta, .. } => meta,
        }
    }

    /// The optional fields, to change.
    pub fn meta_mut(&mut self) -> &mut Meta {
        match self {
            Message::System { meta, .. }
            | Message::User { meta, .. }
            | Message::Assistant { meta, .. }
            | Message::Tool { meta, .. } => meta,
        }
    }

    /// This message with `tag` added.
    pub fn with_tag(mut self, tag: &str) -> Self {
        self.meta_mut().tags.push(tag.to_owned());
        self
    }

    /// This message with a time to live.
    pub fn with_ttl(mut self, ttl: TimeToLive) -> Self {
        self.meta_mut().time_to_live = Some(ttl);
        self
    }

    /// Whether it carries `tag`.
    pub fn has_tag(&self, tag: &str) -> bool {
        self.meta().tags.iter().any(|t| t == tag)
    }

    /// Whether it is an assistant message.
    pub fn is_assistant(&self) -> bool {
        matches!(self, Message::Assistant { .. })
    }

    /// Whether truncation keeps this message: it says so, or it is an agent's
    /// task (its prompt or instructions: without them a long history could
    /// push the task out of the requests).
    pub fn keep_during_truncation(&self) -> bool {
        self.meta().keep_during_truncation.unwrap_or(false)
            || self.has_tag(SPAWN_PROMPT)
            || self.has_tag(INSTRUCTIONS_PROMPT)
    }

    /// The tool calls of an assistant message, in order; empty for other roles.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.assistant_parts().iter().filter_map(|p| match p {
            Part::ToolCall(call) => Some(call),
            _ => None,
        })
    }

    /// The typed parts of an assistant message; empty for other roles and
    /// for a plain-text body.
    pub(crate) fn assistant_parts(&self) -> &[Part] {
        match self {
            Message::Assistant {
                content: Content::Parts(parts),
                ..
            } => parts,
            _ => &[],
        }
    }

    /// The id this message answers, for tool messages.
    pub fn answers(&self) -> Option<&str> {
        match self {
            Message::Tool { tool_call_id, .. } => Some(tool_call_id),
            _ => None,
        }
    }

    /// The plain text of the message (text parts joined), for display and estimates.
    pub fn text(&self) -> String {
        match self {
            Message::System { content, .. }
            | Message::User { content, .. }
            | Message::Assistant { content, .. } => content.text(),
            Message::Tool { content, .. } => content
                .iter()
                .map(|p| match p {
                    ToolResultPart::Json { value } => value.to_string(),
                    ToolResultPart::Media { media_type, .. } => format!("[{media_type}]"),
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// A rough token estimate (`ESTIMATED_BYTES_PER_TOKEN` bytes a token, plus
    /// 4 a message) used when no provider usage is known. Cheap: JSON values
    /// are sized, not serialised.
    pub fn estimated_tokens(&self) -> u64 {
        let bytes = match self {
            Message::System { content, .. }
            | Message::User { content, .. }
            | Message::Assistant { content, .. } => content.byte_len(),
            Message::Tool { content, .. } => content
                .iter()
                .map(|p| match p {
                    ToolResultPart::Json { value } => json_len(value),
                    ToolResultPart::Media { data, .. } => data.len(),
                })
                .sum(),
        };
        (bytes as u64).div_ceil(ESTIMATED_BYTES_PER_TOKEN) + 4
    }

    /// This message with the tool-call parts that `keep` rejects removed.
    /// `None` when nothing is left of an assistant message.
    pub(crate) fn retain_calls(&self, keep: impl Fn(&ToolCall) -> bool) -> Option<Message> {
        let Message::Assistant {
            content: Content::Parts(parts),
            meta,
        } = self
        else {
            return Some(self.clone());
        };
        let kept: Vec<Part> = parts
            .iter()
            .filter(|p| match p {
                Part::ToolCall(call) => keep(call),
                _ => true,
            })
            .cloned()
            .collect();
        if kept.is_empty() {
            return None;
        }
        Some(Message::Assistant {
            content: Content::Parts(kept),
            meta: meta.clone(),
        })
    }
}

impl Content {
    /// The text parts, joined (a plain string as it is).
    pub fn text(&self) -> String {
        match self {
            Content::Text(text) => text.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    Part::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    fn byte_len(&self) -> usize {
        match self {
            Content::Text(text) => text.len(),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match p {
                    Part::Text { text } | Part::Reasoning { text } => text.len(),
                    Part::Image { image, .. } => image.len(),
                    Part::File { data, .. } => data.len(),
                    Part::ToolCall(call) => call.tool_name.len() + call.input.text().len(),
                })
                .sum(),
        }
    }
}

/// About how many bytes `value` takes as JSON text, without writing it.
pub(crate) fn json_len(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 8,
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 2 + items.iter().map(|v| json_len(v) + 1).sum::<usize>(),
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(k, v)| k.len() + 4 + json_len(v))
                .sum::<usize>()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_sizes_are_close_to_their_text() {
        let v =
            json!({"agents": [{"agent_type": "worker", "prompt": "go"}, {"n": 12, "ok": true}]});
        let real = v.to_string().len();
        let estimate = json_len(&v);
        assert!(
            estimate >= real * 8 / 10 && estimate <= real * 12 / 10,
            "{estimate} vs {real}"
        );
    }

    #[test]
    fn every_role_and_part_round_trips() {
        let wire = json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "image": "aGk=", "mediaType": "image/png"},
                {"type": "file", "data": "ZGF0YQ==", "filename": "a.txt", "mediaType": "text/plain"}
            ], "tags": ["T"], "timeToLive": "userPrompt", "sentAt": 1700000000000.0},
            {"role": "assistant", "content": [
                {"type": "reasoning", "text": "hmm"},
                {"type": "text", "text": "ok"},
                {"type": "tool-call", "toolCallId": "c1", "toolName": "read", "input": {"path": "x"}}
            ], "keepDuringTruncation": true, "providerOptions": {"anthropic": {"cache": true}}},
            {"role": "tool", "toolCallId": "c1", "toolName": "read", "content": [
                {"type": "json", "value": {"ok": 1}},
                {"type": "media", "data": "AA==", "mediaType": "image/png"}
            ], "timeToLive": "agentStep"}
        ]);
        let messages: Vec<Message> = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(serde_json::to_value(&messages).unwrap(), wire);
        assert_eq!(messages[2].tool_calls().count(), 1);
        assert_eq!(messages[3].answers(), Some("c1"));
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let m: Message =
            serde_json::from_value(json!({"role": "user", "content": "hi", "weird": 3})).unwrap();
        assert_eq!(m, Message::user("hi"));
    }

    #[test]
    fn an_unknown_role_is_a_clear_error() {
        let err = serde_json::from_value::<Message>(json!({"role": "robot", "content": "hi"}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("robot"), "{err}");
    }

    /// A tool call's input is held as its compact text and reads and
    /// writes as the JSON value it is (issue 34).
    #[test]
    fn a_tool_input_is_its_compact_text_and_round_trips_as_a_value() {
        let wire = json!({"type": "tool-call", "toolCallId": "c", "toolName": "spawn_agents",
            "input": {"agents": [{"agent_type": "a", "prompt": "p1"}, {"agent_type": "b", "params": {"k": [1, 2.5, null]}}]}});
        let part: Part = serde_json::from_value(wire.clone()).unwrap();
        let Part::ToolCall(call) = &part else {
            panic!("a tool call")
        };
        assert_eq!(
            call.input.text(),
            r#"{"agents":[{"agent_type":"a","prompt":"p1"},{"agent_type":"b","params":{"k":[1,2.5,null]}}]}"#
        );
        assert_eq!(serde_json::to_value(&part).unwrap(), wire);
        let text = serde_json::to_string(&part).unwrap();
        assert!(text.contains(r#""input":{"agents":"#), "{text}");
        assert_eq!(serde_json::from_str::<Part>(&text).unwrap(), part);
        // Arguments sent as a string stay a string.
        let as_text = ToolInput::from(json!("{oops"));
        assert_eq!(as_text.value(), json!("{oops"));
        assert_eq!(as_text.arguments(), "{oops");
        assert_eq!(ToolInput::from(json!({"a": 1})).arguments(), r#"{"a":1}"#);
        assert!(ToolInput::default().is_null());
    }
}

//! Tool handles ([`McpTool`], the `Tool` port for one server tool) and the
//! mapping of a `tools/call` result to a tool output.

use std::sync::Arc;

use arbor_actors::message::ToolResultPart;
use arbor_actors::{Tool, ToolContext, ToolError, ToolOutput};
use async_trait::async_trait;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use serde_json::{Value, json};

use super::connect::Secrets;
use super::server::Server;

/// One tool of one server, named `SERVER/TOOL`.
pub(super) struct McpTool {
    /// `None`: no server of that name is configured.
    pub server: Option<Arc<Server>>,
    /// The server's own name for the tool.
    pub tool: String,
    pub name: String,
    pub description: String,
    pub schema: Value,
}

impl McpTool {
    /// A handle whose description and schema are not known (yet): a
    /// permissive object schema, and a description that says so.
    pub(super) fn unlisted(server: Option<Arc<Server>>, server_name: &str, tool: &str) -> Self {
        let why = Self::why_unlisted(server.as_ref(), server_name);
        McpTool {
            server,
            tool: tool.to_owned(),
            name: format!("{server_name}/{tool}"),
            description: format!("MCP tool {server_name}/{tool} (unavailable: {why})"),
            schema: json!({ "type": "object" }),
        }
    }
}

impl McpTool {
    /// Why a tool of `server` has no listing: no such server, it is down
    /// (and why), or it does not list the tool.
    pub(super) fn why_unlisted(server: Option<&Arc<Server>>, server_name: &str) -> String {
        match server {
            None => format!("no MCP server named {server_name} is configured"),
            Some(s) => match s.listing() {
                Ok(_) => format!("MCP server {server_name} does not list it"),
                Err(why) => why.to_string(),
            },
        }
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn input_schema(&self) -> Value {
        self.schema.clone()
    }

    async fn call(&self, input: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let Some(server) = &self.server else {
            return Err(ToolError::new(format!(
                "MCP tool {} is unavailable: no MCP server of that name is configured",
                self.name
            )));
        };
        tracing::debug!(tool = %self.name, call_id = %ctx.call_id, run_id = %ctx.run_id, "MCP call");
        server.call(&self.tool, input).await
    }
}

/// Maps a `tools/call` result: text → a JSON string part, image and audio →
/// media parts, an embedded resource → its text or media, a resource link →
/// a JSON part describing it, `structuredContent` → one more JSON part, and
/// a text block that only repeats it (its JSON text, as the spec asks
/// servers to send beside it) is left out: the model reads it once.
/// `isError: true` → a `ToolError` with the text parts joined (the model
/// reads it). Text the server wrote is scrubbed of the connection's secrets.
/// The whole is cut to `max_bytes` (text cut, media left out) with a note.
pub(super) fn output(
    result: CallToolResult,
    secrets: &Secrets,
    max_bytes: usize,
) -> Result<ToolOutput, ToolError> {
    if result.is_error == Some(true) {
        let text: Vec<String> = result
            .content
            .iter()
            .filter_map(|block| match block {
                ContentBlock::Text(t) => Some(secrets.scrub(&t.text)),
                ContentBlock::Resource(r) => match &r.resource {
                    ResourceContents::TextResourceContents { text, .. } => {
                        Some(secrets.scrub(text))
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect();
        let message = if text.is_empty() {
            match &result.structured_content {
                Some(value) => secrets.scrub(&value.to_string()),
                None => "the tool failed (and said nothing)".to_owned(),
            }
        } else {
            text.join("\n")
        };
        let (message, total) = cut_text(&message, max_bytes);
        return Err(ToolError::new(match total {
            Some(total) => format!("{message}\n{}", cut_note(message.len(), total)),
            None => message,
        }));
    }
    let structured = result.structured_content;
    let mut parts: Vec<ToolResultPart> = result
        .content
        .into_iter()
        // The text form of the structured content is said once, as JSON.
        .filter(|block| match (block, &structured) {
            (ContentBlock::Text(t), Some(value)) => {
                serde_json::from_str::<Value>(&t.text).ok().as_ref() != Some(value)
            }
            _ => true,
        })
        .map(|block| content_part(block, secrets))
        .collect();
    if let Some(value) = structured {
        parts.push(ToolResultPart::Json { value });
    }
    if parts.is_empty() {
        parts.push(ToolResultPart::Json {
            value: Value::String(String::new()),
        });
    }
    Ok(ToolOutput::Parts(bound(parts, max_bytes)))
}

/// The size a part takes of the `max_output_bytes` budget: a text's bytes,
/// a JSON value's text, media's (base64) data.
fn part_bytes(part: &ToolResultPart) -> usize {
    match part {
        ToolResultPart::Json {
            value: Value::String(text),
        } => text.len(),
        ToolResultPart::Json { value } => value.to_string().len(),
        ToolResultPart::Media { data, .. } => data.len(),
    }
}

/// `parts` within `max_bytes`: whole parts while they fit, then the text of
/// the first that does not, cut (media that does not fit is left out), then
/// a note saying how much was shown.
pub(super) fn bound(parts: Vec<ToolResultPart>, max_bytes: usize) -> Vec<ToolResultPart> {
    let total: usize = parts.iter().map(part_bytes).sum();
    if total <= max_bytes {
        return parts;
    }
    let mut kept = Vec::new();
    let mut used = 0;
    let mut full = false;
    let mut left_out = Vec::new();
    for part in parts {
        let size = part_bytes(&part);
        if !full && used + size <= max_bytes {
            used += size;
            kept.push(part);
            continue;
        }
        match part {
            ToolResultPart::Media { data, media_type } => {
                left_out.push(format!("{media_type} of {} bytes", data.len()));
            }
            ToolResultPart::Json { value } => {
                let text = match value {
                    Value::String(text) => text,
                    other => other.to_string(),
                };
                let room = max_bytes - used;
                if !full && room > 0 {
                    let (shown, _) = cut_text(&text, room);
                    used += shown.len();
                    kept.push(ToolResultPart::Json {
                        value: Value::String(shown),
                    });
                }
                // Whatever follows a cut text is not shown.
                full = true;
            }
        }
    }
    let mut note = cut_note(used, total);
    if !left_out.is_empty() {
        note.push_str(&format!(" (left out: {})", left_out.join(", ")));
    }
    kept.push(ToolResultPart::Json {
        value: Value::String(note),
    });
    kept
}

/// The first `max_bytes` of `text` (ending before a character the cut would
/// split), and the full length when it was cut.
fn cut_text(text: &str, max_bytes: usize) -> (String, Option<usize>) {
    if text.len() <= max_bytes {
        return (text.to_owned(), None);
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_owned(), Some(text.len()))
}

fn cut_note(shown: usize, total: usize) -> String {
    format!(
        "[output cut: showed the first {shown} of {total} bytes (the server's max_output_bytes)]"
    )
}

fn content_part(block: ContentBlock, secrets: &Secrets) -> ToolResultPart {
    let text = |text: &str| ToolResultPart::Json {
        value: Value::String(secrets.scrub(text)),
    };
    match block {
        ContentBlock::Text(t) => text(&t.text),
        ContentBlock::Image(image) => ToolResultPart::Media {
            data: image.data,
            media_type: image.mime_type,
        },
        ContentBlock::Audio(audio) => ToolResultPart::Media {
            data: audio.data,
            media_type: audio.mime_type,
        },
        ContentBlock::Resource(embedded) => match embedded.resource {
            ResourceContents::TextResourceContents { text: body, .. } => text(&body),
            ResourceContents::BlobResourceContents {
                blob, mime_type, ..
            } => ToolResultPart::Media {
                data: blob,
                media_type: mime_type.unwrap_or_else(|| "application/octet-stream".to_owned()),
            },
            other => ToolResultPart::Json {
                value: serde_json::to_value(&other).unwrap_or(Value::Null),
            },
        },
        ContentBlock::ResourceLink(link) => ToolResultPart::Json {
            value: json!({
                "type": "resource_link",
                "uri": link.uri,
                "name": link.name,
                "title": link.title,
                "description": link.description,
                "mimeType": link.mime_type,
            }),
        },
        // A kind of content this client does not know: pass it on as JSON.
        other => ToolResultPart::Json {
            value: serde_json::to_value(&other).unwrap_or(Value::Null),
        },
    }
}

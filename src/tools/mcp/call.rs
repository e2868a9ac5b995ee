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
        let why = match &server {
            None => format!("no MCP server named {server_name} is configured"),
            Some(s) => match s.listing() {
                Ok(_) => format!("MCP server {server_name} does not list it"),
                Err(why) => why,
            },
        };
        McpTool {
            server,
            tool: tool.to_owned(),
            name: format!("{server_name}/{tool}"),
            description: format!("MCP tool {server_name}/{tool} (unavailable: {why})"),
            schema: json!({ "type": "object" }),
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
/// a JSON part describing it, `structuredContent` → one more JSON part.
/// `isError: true` → a `ToolError` with the text parts joined (the model
/// reads it). Text the server wrote is scrubbed of the connection's secrets.
pub(super) fn output(result: CallToolResult, secrets: &Secrets) -> Result<ToolOutput, ToolError> {
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
        return Err(ToolError::new(message));
    }
    let mut parts: Vec<ToolResultPart> = result
        .content
        .into_iter()
        .map(|block| content_part(block, secrets))
        .collect();
    if let Some(value) = result.structured_content {
        parts.push(ToolResultPart::Json { value });
    }
    if parts.is_empty() {
        parts.push(ToolResultPart::Json {
            value: Value::String(String::new()),
        });
    }
    Ok(ToolOutput::Parts(parts))
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

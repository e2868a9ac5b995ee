//! The `Tool` port: external tools an agent may call (code, command, MCP). Input
//! is checked against the tool's JSON Schema before `call` runs; a failure
//! becomes a result the model reads.
//!
//! **Cancellation**: a call is cancelled by dropping its future (the agent was
//! cancelled, its step timed out, or its tree ended). A tool that starts work
//! outside the process must end it on drop: an MCP call sends
//! `notifications/cancelled`, a command tool kills its process group.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::message::ToolResultPart;

/// Who is calling, for tools that care.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// The calling agent's tree.
    pub tree_id: Arc<str>,
    /// The calling agent's run id.
    pub run_id: String,
    /// The calling agent's `agentType` (empty if it has none).
    pub agent_type: String,
    /// The id of the model's tool call this call answers.
    pub call_id: String,
}

/// What a tool gives back: one JSON value, or parts (text as JSON strings,
/// images and other media) as the tool result's content.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolOutput {
    /// One JSON value (the result's one `json` part).
    Json(Value),
    /// The result's parts, as they are.
    Parts(Vec<ToolResultPart>),
}

impl From<Value> for ToolOutput {
    fn from(value: Value) -> Self {
        ToolOutput::Json(value)
    }
}

impl ToolOutput {
    /// The content of the tool result message.
    pub fn into_parts(self) -> Vec<ToolResultPart> {
        match self {
            ToolOutput::Json(value) => vec![ToolResultPart::Json { value }],
            ToolOutput::Parts(parts) => parts,
        }
    }
}

/// A tool failure, shown to the model as a `TOOL_CALL_ERROR` result.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
#[non_exhaustive]
pub struct ToolError {
    /// What the model reads (as the result's `errorMessage`).
    pub message: String,
}

impl ToolError {
    /// A failure with this message.
    pub fn new(message: impl Into<String>) -> Self {
        ToolError {
            message: message.into(),
        }
    }
}

/// An external tool (code, command or MCP), as agents see it.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// The name templates and policies use: `NAME` for a code or command tool,
    /// `SERVER/TOOL` for a tool of an MCP server. The toolbox derives the name
    /// the model sees from it (see `toolbox::wire_name`).
    fn name(&self) -> &str;
    /// What the tool does, for the model.
    fn description(&self) -> &str;
    /// JSON Schema of the input object.
    fn input_schema(&self) -> Value;
    /// Runs the tool on an input that satisfies its schema; cancelled by
    /// dropping the future.
    async fn call(&self, input: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError>;
}

//! The `Tool` port: external tools an agent may call. Input is checked against the
//! tool's JSON Schema before `call` runs; a failure becomes a result the model reads.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

/// Who is calling, for tools that care.
#[derive(Clone, Debug)]
pub struct ToolContext {
    pub tree_id: Arc<str>,
    pub run_id: String,
    pub agent_type: String,
}

/// A tool failure, shown to the model as a `TOOL_CALL_ERROR` result.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    pub message: String,
}

impl ToolError {
    pub fn new(message: impl Into<String>) -> Self {
        ToolError {
            message: message.into(),
        }
    }
}

#[async_trait]
pub trait Tool: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn description(&self) -> &str;
    /// JSON Schema of the input object.
    fn input_schema(&self) -> Value;
    async fn call(&self, input: Value, ctx: ToolContext) -> Result<Value, ToolError>;
}

//! Tools for tests.

use std::sync::Arc;

use arbor_actors::{AgentTemplate, Tool, ToolContext, ToolError, ToolOutput};
use async_trait::async_trait;
use serde_json::{Value, json};

/// A tool named `echo` that answers `{"echo": input}`; its input schema is
/// any object unless given ([`Echo::with_schema`]).
pub struct Echo {
    schema: Value,
}

impl Echo {
    /// The echo tool taking any object.
    pub fn new() -> Self {
        Self::with_schema(json!({"type": "object"}))
    }

    /// The echo tool with this input schema.
    pub fn with_schema(schema: Value) -> Self {
        Echo { schema }
    }
}

impl Default for Echo {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Answers with its input."
    }
    fn input_schema(&self) -> Value {
        self.schema.clone()
    }
    async fn call(&self, input: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(json!({ "echo": input }).into())
    }
}

/// The echo tool taking any object.
pub fn echo() -> Arc<dyn Tool> {
    Arc::new(Echo::new())
}

/// A template that may call `echo`.
pub fn with_echo(mut t: AgentTemplate) -> AgentTemplate {
    t.tools.push("echo".to_owned());
    t
}

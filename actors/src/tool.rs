//! The `Tool` port: external tools an agent may call (code, command, MCP). Input
//! is checked against the tool's JSON Schema before `call` runs; a failure
//! becomes a result the model reads.
//!
//! **Cancellation**: a call is cancelled by dropping its future (the agent was
//! cancelled, its step timed out, or its tree ended). A tool that starts work
//! outside the process must end it on drop: an MCP call sends
//! `notifications/cancelled`, a command tool kills its process group.
//!
//! **Writing one**: implement [`Tool`] with the [`async_trait`](macro@async_trait) attribute
//! (re-exported here, so no dependency of one's own is needed), describe the
//! input with a Rust type (`#[derive(serde::Deserialize, schemars::JsonSchema)]`)
//! and give [`schema_for`] of it as the input schema, read the input with
//! [`parse_input`], and register the tool with the runtime
//! (`RuntimeBuilder::tool` in the `arbor` crate, or a `Catalog`).
//!
//! ```
//! use arbor_actors::tool::{Tool, ToolContext, ToolError, ToolOutput, async_trait, parse_input, schema_for};
//! use serde_json::{Value, json};
//!
//! /// The input the model gives: checked against `schema_for::<Input>()`
//! /// before `call` runs.
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Input {
//!     /// The text to count the words of.
//!     text: String,
//! }
//!
//! struct WordCount;
//!
//! #[async_trait]
//! impl Tool for WordCount {
//!     fn name(&self) -> &str {
//!         "word_count"
//!     }
//!     fn description(&self) -> &str {
//!         "Counts the words of a text."
//!     }
//!     fn input_schema(&self) -> Value {
//!         schema_for::<Input>()
//!     }
//!     async fn call(&self, input: Value, _: ToolContext) -> Result<ToolOutput, ToolError> {
//!         let input: Input = parse_input(input)?;
//!         Ok(json!({"words": input.text.split_whitespace().count()}).into())
//!     }
//! }
//! # assert_eq!(WordCount.input_schema()["required"], json!(["text"]));
//! ```

use std::any::Any;
use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;

pub use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::id::{RunId, TreeId};
use crate::message::ToolResultPart;

/// Who is calling, for tools that care.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// The calling agent's tree.
    pub tree_id: TreeId,
    /// The calling agent's run id.
    pub run_id: RunId,
    /// The calling agent's `agentType` (empty if it has none).
    pub agent_type: String,
    /// The id of the model's tool call this call answers.
    pub call_id: String,
    /// The directory the calling agent works in, when its tree has one: the
    /// workspace tools (`arbor_tools::workspace`) resolve every path against
    /// it and answer with an error without one.
    pub workspace: Option<Arc<dyn Workspace>>,
}

/// A tree's workspace, as the runtime carries it to tools: opened by the
/// tools crate (`arbor_tools::workspace::Workspace`, which also keeps what
/// each agent last read there), carried here as a trait object so that the
/// runtime and the supervisor need not know its type; the tools get theirs
/// back by upcasting to [`Any`] and downcasting.
pub trait Workspace: Any + Send + Sync + Debug {
    /// The workspace's directory (canonical).
    fn root(&self) -> &Path;
    /// Whether agents may only read there.
    fn read_only(&self) -> bool;

    /// A workspace of its own for the run `run` (an agent of type
    /// `agent_type`) whose template asks for `isolation = "worktree"`: a
    /// git worktree on a new branch from this one. Made when first used
    /// (never here: this runs in an actor's handler). `None`: this
    /// workspace cannot isolate, and the run shares it.
    fn isolate(self: Arc<Self>, run: &RunId, agent_type: &str) -> Option<Arc<dyn Workspace>> {
        let _ = (run, agent_type);
        None
    }

    /// Seals an isolated workspace when its run completes: commits what is
    /// left, reports the branch, removes a worktree without changes. `None`:
    /// nothing to seal (a shared workspace, or a worktree never made).
    fn seal(self: Arc<Self>) -> Option<SealFuture> {
        None
    }
}

/// What [`Workspace::seal`] gives: the report, once git has answered.
pub type SealFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Option<crate::worktree::WorktreeReport>> + Send>,
>;

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
    /// Other names policies and approval patterns may use for this tool (a
    /// workspace tool under Claude Code's or Codebuff's name is also its
    /// `workspace/OP`). None by default.
    fn aliases(&self) -> Vec<String> {
        Vec::new()
    }
    /// JSON Schema of the input object.
    fn input_schema(&self) -> Value;
    /// Whether a call changes nothing outside its run (MCP's
    /// `readOnlyHint`): reading files, searching, thinking. A call that may
    /// change something (the default) starts only once everything its tree
    /// recorded before it is stored (see `TreeHooks::stored`): after a
    /// crash, a resumed run redoes at most that call, never the steps
    /// before it. A read-only call starts at once.
    fn is_read_only(&self) -> bool {
        false
    }
    /// Runs the tool on an input that satisfies its schema; cancelled by
    /// dropping the future.
    async fn call(&self, input: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError>;
}

/// The JSON Schema of `T`'s input, as [`Tool::input_schema`] gives it:
/// derived with `schemars` (`#[derive(schemars::JsonSchema)]`, doc comments
/// becoming descriptions) for what `serde` deserialises, subschemas inlined
/// (a recursive type keeps its `$defs`), and without the `$schema` key some
/// providers refuse.
pub fn schema_for<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|settings| {
            settings.inline_subschemas = true;
            settings.meta_schema = None;
        })
        .into_generator();
    generator.into_root_schema_for::<T>().to_value()
}

/// The tool's input as a `T` (the type [`schema_for`] described), or a
/// [`ToolError`] the model reads, naming what does not fit.
pub fn parse_input<T: DeserializeOwned>(input: Value) -> Result<T, ToolError> {
    serde_json::from_value(input).map_err(|e| ToolError::new(format!("invalid input: {e}")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::schema::Schema;

    /// A tool input with a nested type, an optional field and an enum.
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Lookup {
        /// What to look up.
        query: String,
        /// Where.
        place: Place,
        /// How many results at most.
        limit: Option<u32>,
    }

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[serde(rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Place {
        Notes,
        Web,
    }

    #[test]
    fn a_derived_schema_is_an_inlined_object_schema_that_checks_the_input() {
        let schema = schema_for::<Lookup>();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["required"], json!(["query", "place"]));
        assert_eq!(
            schema["properties"]["query"]["description"],
            "What to look up."
        );
        assert_eq!(
            schema["properties"]["place"]["enum"],
            json!(["notes", "web"])
        );
        assert!(schema.get("$schema").is_none(), "{schema}");
        assert!(schema.get("$defs").is_none(), "{schema}");
        let compiled = Schema::compile(schema).unwrap();
        compiled
            .check(&json!({"query": "q", "place": "web", "limit": 3}))
            .unwrap();
        let refused = compiled
            .check(&json!({"query": "q", "place": "moon"}))
            .unwrap_err();
        assert!(refused.to_string().contains("/place"), "{refused}");
    }

    #[test]
    fn an_input_that_does_not_fit_is_an_error_naming_the_field() {
        let error = parse_input::<Lookup>(json!({"query": "q"})).err().unwrap();
        assert!(error.message.contains("missing field `place`"), "{error}");
        let lookup: Lookup = parse_input(json!({"query": "q", "place": "notes"})).unwrap();
        assert_eq!(lookup.limit, None);
    }
}

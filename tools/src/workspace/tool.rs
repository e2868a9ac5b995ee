//! One workspace tool as the runtime sees it: a name and an input schema of
//! one family, and the operation it runs on the calling agent's workspace.

use std::any::Any;
use std::sync::Arc;

use arbor_actors::tool::{Tool, ToolContext, ToolError, ToolOutput, async_trait};
use serde_json::Value;

use super::confine::{Refusal, Workspace};
use super::{arbor, claude, codebuff};

/// Whose names and input schemas a workspace tool has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Arbor's own: `workspace/read`, `workspace/write`, ...
    Arbor,
    /// Codebuff's: `read_files`, `write_file`, `str_replace`, ...
    Codebuff,
    /// Claude Code's: `Read`, `Write`, `Edit`, `MultiEdit`, `Bash`, ...
    Claude,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 3] = [Family::Arbor, Family::Codebuff, Family::Claude];
}

/// What a workspace tool does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Reads files.
    Read,
    /// Writes a file.
    Write,
    /// Replaces exact text in a file (one or several edits).
    Edit,
    /// Several edits of one file (Claude Code's MultiEdit).
    MultiEdit,
    /// Lists a directory.
    List,
    /// Finds files by glob.
    Glob,
    /// Finds files from a description (Codebuff's `find_files`: here a path
    /// search, not a model).
    FindFiles,
    /// Searches file contents.
    Grep,
    /// Runs a shell command.
    Shell,
    /// Writes the agent's todo list.
    Todos,
    /// Thinks aloud.
    Think,
}

/// A workspace tool of one family (see the module docs of
/// [`crate::workspace`]).
pub struct WorkspaceTool {
    pub(super) name: &'static str,
    pub(super) family: Family,
    pub(super) op: Op,
    pub(super) description: &'static str,
    pub(super) schema: Value,
}

impl WorkspaceTool {
    /// Its family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// What it does.
    pub fn op(&self) -> Op {
        self.op
    }
}

#[async_trait]
impl Tool for WorkspaceTool {
    fn name(&self) -> &str {
        self.name
    }

    fn description(&self) -> &str {
        self.description
    }

    /// Arbor's name for what it does (`Bash` is also `workspace/shell`,
    /// `MultiEdit` `workspace/edit`, `find_files` `workspace/glob`), so a
    /// policy or approval pattern over `workspace/…` reaches every family.
    fn aliases(&self) -> Vec<String> {
        if self.family == super::Family::Arbor {
            return Vec::new();
        }
        let op = match self.op {
            Op::MultiEdit => Op::Edit,
            Op::FindFiles => Op::Glob,
            op => op,
        };
        super::arbor::tools()
            .iter()
            .filter(|t| t.op == op)
            .map(|t| t.name.to_owned())
            .collect()
    }

    fn input_schema(&self) -> Value {
        self.schema.clone()
    }

    /// Reading, listing, searching, thinking and the todo list (kept in
    /// the run's history) change nothing in the workspace.
    fn is_read_only(&self) -> bool {
        matches!(
            self.op,
            Op::Read | Op::List | Op::Glob | Op::FindFiles | Op::Grep | Op::Todos | Op::Think
        )
    }

    async fn call(&self, input: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let ws = workspace_of(self.name, &ctx).await?;
        match self.family {
            Family::Arbor => arbor::call(self, ws, input, ctx).await,
            Family::Codebuff => codebuff::call(self, ws, input, ctx).await,
            Family::Claude => claude::call(self, ws, input, ctx).await,
        }
    }
}

/// The calling agent's workspace, or the error a tool without one answers.
pub async fn workspace_of(tool: &str, ctx: &ToolContext) -> Result<Arc<Workspace>, ToolError> {
    let Some(handle) = ctx.workspace.clone() else {
        return Err(ToolError::new(format!(
            "{tool}: this agent has no workspace, so it cannot use files or the shell (its tree was started without one)"
        )));
    };
    let any: Arc<dyn Any + Send + Sync> = handle;
    let any = match any.downcast::<Workspace>() {
        Ok(ws) => return Ok(ws),
        Err(any) => any,
    };
    match any.downcast::<super::worktree::Worktree>() {
        // The agent's own worktree is made the first time it is used.
        Ok(worktree) => worktree
            .open()
            .await
            .map_err(|e| ToolError::new(format!("{tool}: {e}"))),
        Err(_) => Err(ToolError::new(format!(
            "{tool}: this agent's workspace is not one the workspace tools can use"
        ))),
    }
}

/// The input schema of `T` ([`schema_for`](arbor_actors::tool::schema_for)),
/// without the type's own title and doc comment, which the tool's
/// description says better.
pub(super) fn input_schema<T: schemars::JsonSchema>() -> Value {
    let mut schema = arbor_actors::tool::schema_for::<T>();
    if let Some(object) = schema.as_object_mut() {
        object.remove("title");
        object.remove("description");
    }
    schema
}

/// The key of the calling agent in the workspace's stale-write record.
pub(super) fn agent(ctx: &ToolContext) -> String {
    ctx.run_id.to_string()
}

/// Runs `op` (file system work) off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    op: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
) -> Result<T, ToolError> {
    match tokio::task::spawn_blocking(op).await {
        Ok(result) => result.map_err(ToolError::from),
        Err(e) => Err(ToolError::new(format!("the operation failed: {e}"))),
    }
}

//! The workspace tools, called as the runtime calls them: through each
//! family's `Tool`, with a `ToolContext` carrying a workspace made in a
//! temporary directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod behaviour;
mod escape;
mod families;
mod shell;
mod stale;

use std::path::Path;
use std::sync::Arc;

use arbor_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};
use arbor_tools::workspace::{self, Access, Family, Workspace};
use serde_json::Value;

/// A context for the agent run `run` in `ws`.
pub fn ctx(ws: &Arc<dyn arbor_actors::tool::Workspace>, run: &str) -> ToolContext {
    // A run of its own per label (`agent-1`, `tree/a`): a child of the
    // root numbered from the label.
    let ordinal = run
        .bytes()
        .fold(0u32, |n, b| n.wrapping_mul(31).wrapping_add(u32::from(b)))
        % 100_000;
    ToolContext {
        tree_id: "t-ws".parse().expect("a tree id"),
        run_id: format!("t-ws/0.{ordinal}").parse().expect("a run id"),
        agent_type: "editor".to_owned(),
        call_id: format!("call-{run}-{}", std::process::id()),
        workspace: Some(ws.clone()),
    }
}

/// The workspace at `dir`, as a context carries it.
pub fn open(dir: &Path, access: Access) -> Arc<dyn arbor_actors::tool::Workspace> {
    Workspace::open(dir, access).unwrap().into_handle()
}

/// The workspace tool named `name`, of whichever family.
pub fn tool(name: &str) -> Arc<dyn Tool> {
    workspace::all_tools()
        .into_iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("no workspace tool {name}"))
}

/// Calls the tool `name` with `input`.
pub async fn call(name: &str, input: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
    tool(name).call(input, ctx.clone()).await
}

/// A call's result as text: a JSON string as is, anything else as JSON.
pub fn text(out: &ToolOutput) -> String {
    match out {
        ToolOutput::Json(Value::String(s)) => s.clone(),
        ToolOutput::Json(v) => v.to_string(),
        ToolOutput::Parts(p) => format!("{p:?}"),
    }
}

/// A call's JSON result.
pub fn json(out: &ToolOutput) -> Value {
    match out {
        ToolOutput::Json(v) => v.clone(),
        ToolOutput::Parts(p) => panic!("parts: {p:?}"),
    }
}

/// Every family's tools, for the tests that go over all of them.
pub fn families() -> [Family; 3] {
    Family::ALL
}

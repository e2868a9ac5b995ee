//! The todo list and the think tool: nothing on disk. A todo list is given
//! back whole in the tool's result, so the journal holds every version of
//! it (the views read it from there, in a later step); a thought is only
//! the call's input.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// Where a task stands (`pending`, `in_progress`, `completed`; its schema
/// a plain `enum`, as Claude Code's, without a description per value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)] // Documented above: a doc comment per value would change the schema.
pub enum Status {
    Pending,
    InProgress,
    Completed,
}

/// One task of a todo list, as every family's list is kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Todo {
    /// The task.
    pub content: String,
    /// Where it stands.
    pub status: Status,
    /// What is being done, in the present continuous ("Running the
    /// tests"), when the family gives it.
    #[serde(rename = "activeForm", skip_serializing_if = "Option::is_none")]
    pub active_form: Option<String>,
}

/// The list as lines: `[x]` done, `[>]` in progress, `[ ]` pending, and a
/// count of the done ones.
pub fn render(todos: &[Todo]) -> String {
    let mut out = String::new();
    for t in todos {
        let mark = match t.status {
            Status::Completed => "[x]",
            Status::InProgress => "[>]",
            Status::Pending => "[ ]",
        };
        let _ = writeln!(out, "{mark} {}", t.content);
    }
    let done = todos
        .iter()
        .filter(|t| t.status == Status::Completed)
        .count();
    let _ = write!(out, "({done}/{} done)", todos.len());
    out
}

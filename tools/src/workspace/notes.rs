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

/// The names of the todo tools of every family, as the model calls them
/// (Arbor's `workspace/todos` on the wire).
pub const TODO_TOOLS: [&str; 3] = ["workspace__todos", "write_todos", "TodoWrite"];

/// The run's todo list as its last todo call (of any family) that was
/// taken wrote it, read off its history (every call gives the whole list);
/// a call answered with an error (bad input, refused by a hook or a
/// person) wrote nothing. `None` when it never wrote one. What the API,
/// `arbor show` and the page show.
pub fn latest(history: &arbor_actors::History) -> Option<Vec<Todo>> {
    use arbor_actors::message::TOOL_CALL_ERROR;
    let failed: std::collections::HashSet<&str> = history
        .iter()
        .filter_map(|m| match &**m {
            arbor_actors::Message::Tool { tool_call_id, .. } if m.has_tag(TOOL_CALL_ERROR) => {
                Some(tool_call_id.as_str())
            }
            _ => None,
        })
        .collect();
    history.iter().rev().find_map(|m| {
        m.tool_calls()
            .filter(|c| {
                TODO_TOOLS.contains(&c.tool_name.as_str())
                    && !failed.contains(c.tool_call_id.as_str())
            })
            .last()
            .and_then(|c| from_input(&c.input.value()))
    })
}

/// A todo call's list, whichever family's shape it has: each entry's
/// `content` (Claude Code, Arbor) or `task` (Codebuff), its `status`, or
/// `completed` (Codebuff's boolean), and `activeForm` when given.
pub fn from_input(input: &serde_json::Value) -> Option<Vec<Todo>> {
    let entries = input.get("todos")?.as_array()?;
    let todos = entries
        .iter()
        .filter_map(|e| {
            let content = e
                .get("content")
                .or_else(|| e.get("task"))
                .and_then(serde_json::Value::as_str)?
                .to_owned();
            let status = match (
                e.get("status").and_then(serde_json::Value::as_str),
                e.get("completed").and_then(serde_json::Value::as_bool),
            ) {
                (Some("completed"), _) | (None, Some(true)) => Status::Completed,
                (Some("in_progress"), _) => Status::InProgress,
                _ => Status::Pending,
            };
            let active_form = e
                .get("activeForm")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned);
            Some(Todo {
                content,
                status,
                active_form,
            })
        })
        .collect();
    Some(todos)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use arbor_actors::message::ToolCall;
    use arbor_actors::{History, Message};
    use serde_json::json;

    use super::*;

    fn call(name: &str, input: serde_json::Value) -> Message {
        Message::assistant(
            None,
            vec![ToolCall {
                tool_call_id: "c".into(),
                tool_name: name.into(),
                input: input.into(),
            }],
        )
    }

    #[test]
    fn the_latest_todo_list_of_any_family_is_read_off_the_history() {
        let mut history = History::new();
        assert_eq!(latest(&history), None);
        history.push(call(
            "TodoWrite",
            json!({"todos": [{"content": "Run the tests", "status": "in_progress", "activeForm": "Running the tests"}]}),
        ));
        history.push(Message::user("go on"));
        let todos = latest(&history).unwrap();
        assert_eq!(todos[0].status, Status::InProgress);
        assert_eq!(todos[0].active_form.as_deref(), Some("Running the tests"));
        // Codebuff's shape, written later, wins.
        history.push(call(
            "write_todos",
            json!({"todos": [{"task": "Fix a.txt", "completed": true}, {"task": "Fix b.txt", "completed": false}]}),
        ));
        let todos = latest(&history).unwrap();
        assert_eq!(
            todos
                .iter()
                .map(|t| (t.content.as_str(), t.status))
                .collect::<Vec<_>>(),
            [
                ("Fix a.txt", Status::Completed),
                ("Fix b.txt", Status::Pending)
            ]
        );
        assert_eq!(render(&todos), "[x] Fix a.txt\n[ ] Fix b.txt\n(1/2 done)");
        // Arbor's own, as the model calls it on the wire.
        history.push(call(
            "workspace__todos",
            json!({"todos": [{"content": "Merge", "status": "pending"}]}),
        ));
        assert_eq!(latest(&history).unwrap()[0].content, "Merge");
    }

    #[test]
    fn a_todo_call_that_was_refused_wrote_no_list() {
        let mut history = History::new();
        history.push(call(
            "TodoWrite",
            json!({"todos": [{"content": "kept", "status": "pending"}]}),
        ));
        let refused = ToolCall {
            tool_call_id: "c2".into(),
            tool_name: "TodoWrite".into(),
            input: json!({"todos": [{"content": "refused", "status": "pending"}]}).into(),
        };
        history.push(Message::assistant(None, vec![refused.clone()]));
        history.push(Message::tool_error(&refused, "a hook denied it"));
        assert_eq!(latest(&history).unwrap()[0].content, "kept");
    }
}

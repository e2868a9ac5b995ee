//! How a finished run becomes the `value` its parent sees (semantics §7),
//! and the text a person (or an embedder) reads from it ([`RunResult::text`]).

use serde_json::{Value, json};

use crate::state::{AgentState, AgentStatus};
use crate::supervision::RunResult;
use crate::template::OutputMode;

/// The child's output value. `inherited` is how many messages the run started with,
/// so `all_messages` returns exactly what the run added.
pub fn output_value(state: &AgentState, mode: OutputMode, inherited: usize) -> Value {
    let mut value = match state.status {
        AgentStatus::Completed => completed_value(state, mode, inherited),
        AgentStatus::Running => return error_value("agent is still running"),
        AgentStatus::Cancelled => error_value("Agent was cancelled"),
        AgentStatus::Failed => error_value(state.error_message().unwrap_or("Agent failed")),
    };
    // A worktree's branch is part of what its parent learns (issue 36), a
    // failed or cancelled run's too: what it changed is kept there.
    if let (Some(report), Value::Object(map)) = (&state.worktree, &mut value)
        && let Ok(report) = serde_json::to_value(report)
    {
        map.insert("worktree".to_owned(), report);
    }
    value
}

fn completed_value(state: &AgentState, mode: OutputMode, inherited: usize) -> Value {
    match mode {
        OutputMode::LastMessage => {
            let turn = state.message_history.last_assistant_turn();
            if turn.is_empty() {
                return error_value("No response from agent");
            }
            json!({"type": "lastMessage", "value": turn})
        }
        OutputMode::AllMessages => {
            json!({"type": "allMessages", "value": state.message_history.skip(inherited)})
        }
        OutputMode::StructuredOutput => {
            json!({"type": "structuredOutput", "value": state.output.clone().unwrap_or(Value::Null)})
        }
    }
}

pub(crate) fn error_value(message: &str) -> Value {
    json!({"type": "error", "message": message})
}

impl RunResult {
    /// The run's final text, whatever its template's output mode:
    ///
    /// - `last_message` and `all_messages`: the text of its last assistant
    ///   turn (its text parts, joined by newlines; empty if the turn has
    ///   none);
    /// - `structured_output`: the output it set, as pretty-printed JSON (the
    ///   last assistant turn's text if it set none);
    /// - a run that failed or was cancelled: the error its parent reads (the
    ///   failure's cause, `Agent was cancelled`), as [`error`](Self::error)
    ///   gives it.
    ///
    /// (The state's `output` is only the structured output, `null` in the
    /// other modes, as on the wire; [`value`](Self::value) is the whole §7
    /// value a parent sees.)
    pub fn text(&self) -> String {
        if let Some(error) = self.error() {
            return error.to_owned();
        }
        match self.value.get("value") {
            Some(output)
                if self.value.get("type") == Some(&json!("structuredOutput"))
                    && !output.is_null() =>
            {
                serde_json::to_string_pretty(output).unwrap_or_else(|_| output.to_string())
            }
            _ => last_text(&self.state),
        }
    }

    /// Why the run did not complete (failed or cancelled): the error its
    /// parent reads; `None` for a completed run.
    pub fn error(&self) -> Option<&str> {
        if self.value.get("type") != Some(&json!("error")) {
            return None;
        }
        Some(
            self.value
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or(""),
        )
    }
}

/// The text of a state's last assistant turn: its text parts, joined by
/// newlines; empty when it has none.
pub fn last_text(state: &AgentState) -> String {
    state
        .message_history
        .last_assistant_turn()
        .iter()
        .filter(|m| m.is_assistant())
        .map(|m| m.text())
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::History;
    use crate::message::{Message, TOOL_CALL_ERROR};

    fn state(history: Vec<Message>, status: AgentStatus) -> AgentState {
        AgentState {
            message_history: history.into_iter().collect::<History>(),
            status,
            ..AgentState::of_run("t/0".parse().unwrap())
        }
    }

    #[test]
    fn last_message_is_the_last_assistant_turn() {
        let s = state(
            vec![
                Message::user("q"),
                Message::assistant_text("a1"),
                Message::assistant_text("a2"),
            ],
            AgentStatus::Completed,
        );
        let v = output_value(&s, OutputMode::LastMessage, 0);
        assert_eq!(v["type"], "lastMessage");
        assert_eq!(v["value"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn last_message_without_a_reply_is_an_error() {
        let s = state(vec![Message::user("q")], AgentStatus::Completed);
        assert_eq!(
            output_value(&s, OutputMode::LastMessage, 0),
            json!({"type": "error", "message": "No response from agent"})
        );
    }

    #[test]
    fn last_message_skips_tool_call_errors() {
        let call = crate::message::ToolCall {
            tool_call_id: "x".into(),
            tool_name: "nope".into(),
            input: json!({}).into(),
        };
        let s = state(
            vec![
                Message::user("q"),
                Message::assistant(None, vec![call.clone()]),
                Message::tool_error(&call, "Tool nope not found"),
            ],
            AgentStatus::Completed,
        );
        let v = output_value(&s, OutputMode::LastMessage, 0);
        let turn = v["value"].as_array().unwrap();
        assert_eq!(turn.len(), 1);
        assert!(!turn.iter().any(|m| m["tags"] == json!([TOOL_CALL_ERROR])));
    }

    #[test]
    fn all_messages_drops_exactly_the_inherited_prefix() {
        let s = state(
            vec![
                Message::user("inherited 1"),
                Message::user("inherited 2"),
                Message::user("prompt"),
                Message::assistant_text("mine"),
            ],
            AgentStatus::Completed,
        );
        let v = output_value(&s, OutputMode::AllMessages, 3);
        assert_eq!(v["type"], "allMessages");
        assert_eq!(
            v["value"],
            json!([{"role": "assistant", "content": "mine"}])
        );
    }

    #[test]
    fn structured_output_is_the_output_or_null() {
        let mut s = state(vec![], AgentStatus::Completed);
        assert_eq!(
            output_value(&s, OutputMode::StructuredOutput, 0)["value"],
            Value::Null
        );
        s.output = Some(json!({"k": 1}));
        assert_eq!(
            output_value(&s, OutputMode::StructuredOutput, 0),
            json!({"type": "structuredOutput", "value": {"k": 1}})
        );
    }

    /// The result a root hands back: its state and the value of its mode.
    fn result(state: AgentState, mode: OutputMode) -> RunResult {
        let value = output_value(&state, mode, 0);
        RunResult {
            state: std::sync::Arc::new(state),
            value,
        }
    }

    #[test]
    fn text_is_the_final_text_in_every_output_mode() {
        let call = crate::message::ToolCall {
            tool_call_id: "c".into(),
            tool_name: "look".into(),
            input: json!({}).into(),
        };
        let history = vec![
            Message::user("q"),
            Message::assistant_text("first"),
            Message::user("again"),
            Message::assistant(Some("looking".into()), vec![call.clone()]),
            Message::tool_result(&call, json!({"found": 1})),
            Message::assistant_text("found one"),
            Message::assistant_text("that is all"),
        ];
        for mode in [OutputMode::LastMessage, OutputMode::AllMessages] {
            let done = result(state(history.clone(), AgentStatus::Completed), mode);
            assert_eq!(done.text(), "found one\nthat is all", "{mode:?}");
            assert_eq!(done.error(), None);
        }
        let mut structured = state(history.clone(), AgentStatus::Completed);
        structured.output = Some(json!({"answer": 42}));
        let done = result(structured, OutputMode::StructuredOutput);
        assert_eq!(done.text(), "{\n  \"answer\": 42\n}");
        let unset = result(
            state(history.clone(), AgentStatus::Completed),
            OutputMode::StructuredOutput,
        );
        assert_eq!(unset.text(), "found one\nthat is all");
    }

    #[test]
    fn text_of_a_run_that_did_not_complete_is_its_error() {
        let mut failed = state(vec![Message::user("q")], AgentStatus::Failed);
        failed.output = Some(json!({"errorMessage": "limit max_steps reached"}));
        let failed = result(failed, OutputMode::LastMessage);
        assert_eq!(failed.error(), Some("limit max_steps reached"));
        assert_eq!(failed.text(), "limit max_steps reached");
        let cancelled = result(
            state(
                vec![Message::user("q"), Message::assistant_text("half")],
                AgentStatus::Cancelled,
            ),
            OutputMode::StructuredOutput,
        );
        assert_eq!(cancelled.text(), "Agent was cancelled");
    }

    #[test]
    fn a_failure_is_an_error_with_its_cause() {
        let mut s = state(vec![], AgentStatus::Failed);
        s.output = Some(json!({"errorMessage": "limit max_steps reached"}));
        assert_eq!(
            output_value(&s, OutputMode::StructuredOutput, 0),
            json!({"type": "error", "message": "limit max_steps reached"})
        );
    }
}

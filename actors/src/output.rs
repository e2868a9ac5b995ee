//! How a finished run becomes the `value` its parent sees (semantics §7).

use serde_json::{Value, json};

use crate::state::{AgentState, AgentStatus};
use crate::template::OutputMode;

/// The child's output value. `inherited` is how many messages the run started with,
/// so `all_messages` returns exactly what the run added.
pub fn output_value(state: &AgentState, mode: OutputMode, inherited: usize) -> Value {
    match state.status {
        AgentStatus::Completed => {}
        AgentStatus::Running => return error_value("agent is still running"),
        AgentStatus::Cancelled => return error_value("Agent was cancelled"),
        AgentStatus::Failed => {
            return error_value(state.error_message().unwrap_or("Agent failed"));
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::History;
    use crate::message::{Message, TOOL_CALL_ERROR};

    fn state(history: Vec<Message>, status: AgentStatus) -> AgentState {
        AgentState {
            message_history: history.into_iter().collect::<History>(),
            status,
            ..AgentState::default()
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
            input: json!({}),
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

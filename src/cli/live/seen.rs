//! What the live view takes from one event: the same from a live
//! [`Event`] and from a [`JournalEntry`] (a tree followed through its store
//! or a server's stream), so that both draw the same lines.

use arbor_actors::{AgentStatus, Delta, EventKind, RunId};
use arbor_supervisor::store::{EventType, JournalEntry};
use serde_json::Value;

/// What the view takes from one event, whether it came live (an [`Event`]
/// of a tree this process runs) or as a journal entry (a tree followed
/// through its store or a server's stream, `arbor watch`).
#[derive(Debug, PartialEq)]
pub(super) enum Seen {
    Started {
        agent_type: String,
        parent: Option<RunId>,
        depth: usize,
    },
    Step(u32),
    /// A piece of the reply streamed in (text, reasoning or a tool call's
    /// arguments).
    Streamed(String),
    Retrying {
        attempt: u32,
        reason: String,
    },
    Responded {
        tokens: u64,
        cost: f64,
        calls: usize,
        tools: Vec<String>,
    },
    ToolDone,
    Suspended,
    Approval(String),
    Budget(String),
    Ended(AgentStatus),
    /// Nothing the view shows.
    Other,
}

impl Seen {
    pub(super) fn of_event(kind: &EventKind) -> Seen {
        match kind {
            EventKind::AgentStarted {
                agent_type,
                parent_run_id,
                depth,
                ..
            } => Seen::Started {
                agent_type: agent_type.clone(),
                parent: parent_run_id.clone(),
                depth: *depth,
            },
            EventKind::StepStarted { step } => Seen::Step(*step),
            EventKind::ModelDelta { delta, .. } => Seen::Streamed(match delta {
                Delta::Text { text }
                | Delta::Reasoning { text }
                | Delta::ToolCallArgs { text, .. } => text.clone(),
                _ => String::new(),
            }),
            EventKind::ModelRetrying {
                attempt, reason, ..
            } => Seen::Retrying {
                attempt: *attempt,
                reason: reason.clone(),
            },
            EventKind::ModelResponded {
                usage,
                tool_calls,
                reply,
                ..
            } => Seen::Responded {
                tokens: usage.total_tokens(),
                cost: usage.cost,
                calls: *tool_calls,
                tools: reply
                    .as_ref()
                    .map(|m| m.tool_calls().map(|c| c.tool_name.clone()).collect())
                    .unwrap_or_default(),
            },
            EventKind::ToolCalled { .. } => Seen::ToolDone,
            EventKind::Suspended => Seen::Suspended,
            EventKind::ApprovalRequested { tool, .. } => Seen::Approval(tool.clone()),
            EventKind::BudgetReached { limit } => Seen::Budget(limit.to_string()),
            EventKind::AgentFinished { .. } => Seen::Ended(AgentStatus::Completed),
            EventKind::AgentFailed { .. } => Seen::Ended(AgentStatus::Failed),
            EventKind::AgentCancelled { .. } => Seen::Ended(AgentStatus::Cancelled),
            _ => Seen::Other,
        }
    }

    /// The same from a journal entry (the event's fields as JSON); a field
    /// missing or of another shape reads as nothing (a journal written by
    /// a newer build shows what this one knows of it).
    pub(super) fn of_entry(entry: &JournalEntry) -> Seen {
        let get = |field: &str| entry.get(field);
        let number = |field: &str| get(field).and_then(Value::as_u64).unwrap_or(0);
        let text = |field: &str| {
            get(field)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        match entry.kind {
            EventType::AgentStarted => Seen::Started {
                agent_type: text("agentType"),
                parent: get("parentRunId")
                    .and_then(Value::as_str)
                    .and_then(|p| p.parse().ok()),
                // Indented by it: a journal's (or a server's) word, bounded.
                depth: usize::try_from(number("depth").min(super::MAX_INDENT)).unwrap_or(0),
            },
            EventType::StepStarted => Seen::Step(u32::try_from(number("step")).unwrap_or(0)),
            EventType::ModelRetrying => Seen::Retrying {
                attempt: u32::try_from(number("attempt")).unwrap_or(0),
                reason: text("reason"),
            },
            EventType::ModelResponded => {
                let usage = get("usage");
                let of = |key: &str| usage.and_then(|u| u.get(key));
                let tokens = ["inputTokens", "outputTokens"]
                    .iter()
                    .filter_map(|k| of(k).and_then(Value::as_u64))
                    .sum();
                let tools = get("tools")
                    .and_then(Value::as_array)
                    .map(|names| {
                        names
                            .iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                Seen::Responded {
                    tokens,
                    cost: of("cost").and_then(Value::as_f64).unwrap_or(0.0),
                    calls: usize::try_from(number("toolCalls")).unwrap_or(0),
                    tools,
                }
            }
            EventType::ToolCalled => Seen::ToolDone,
            EventType::Suspended => Seen::Suspended,
            EventType::ApprovalRequested => Seen::Approval(text("tool")),
            EventType::BudgetReached => {
                let limit = get("limit");
                let part = |key: &str| {
                    limit
                        .and_then(|l| l.get(key))
                        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                        .unwrap_or_default()
                };
                Seen::Budget(format!(
                    "limit {} reached: {}",
                    part("limit"),
                    part("detail")
                ))
            }
            EventType::AgentFinished => Seen::Ended(AgentStatus::Completed),
            EventType::AgentFailed => Seen::Ended(AgentStatus::Failed),
            EventType::AgentCancelled => Seen::Ended(AgentStatus::Cancelled),
            _ => Seen::Other,
        }
    }
}

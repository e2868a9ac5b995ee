//! An [`Event`] as one line of text (its `Display`): the run it is about (its
//! id starts with the tree's), the kind's wire name and the kind's key fields
//! (the ids in them without the tree's prefix), long text cut to one short
//! line. For logs and for embedders printing a tree as it runs; the CLI's
//! tree view (`arbor run`) is its own.

use std::fmt;

use crate::approval::Decision;
use crate::event::{Event, EventKind};
use crate::id::{RunId, TreeId};
use crate::model::Delta;
use crate::output::last_text;

/// Longest quoted text (a reply, a prompt, an input) on a line, in characters.
const CLIP: usize = 60;

impl fmt::Display for Event {
    /// `RUN KIND FIELDS`, e.g.
    /// `t019af3c2e5a17c3e8b5d2f4a6c8e0b13/0.1 toolCalled step 2 word_count (call 0.1-s2-c0)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.run_id, self.kind.name())?;
        let fields = fields(&self.kind, &Short(&self.tree_id));
        if !fields.is_empty() {
            write!(f, " {fields}")?;
        }
        Ok(())
    }
}

/// Ids of the event's tree without the tree's prefix: `0.1` for `T/0.1`.
struct Short<'a>(&'a TreeId);

impl Short<'_> {
    /// An id made from a run id (a tool call's), without the tree's prefix.
    fn id<'i>(&self, id: &'i str) -> &'i str {
        id.strip_prefix(self.0.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
            .unwrap_or(id)
    }

    /// A run id, without the tree's prefix when it is of this tree.
    fn run(&self, id: &RunId) -> String {
        if id.tree() == self.0 {
            id.path_text().to_string()
        } else {
            id.to_string()
        }
    }
}

/// The key fields of `kind`, on one line; empty for a kind that has none.
fn fields(kind: &EventKind, short: &Short) -> String {
    match kind {
        EventKind::AgentStarted {
            agent_type,
            parent_run_id,
            depth,
            ..
        } => {
            let agent = if agent_type.is_empty() {
                "agent"
            } else {
                agent_type
            };
            match parent_run_id {
                Some(parent) => format!("{agent} at depth {depth}, child of {}", short.run(parent)),
                None => format!("{agent} at depth {depth}"),
            }
        }
        EventKind::Checkpointed { .. } | EventKind::Suspended | EventKind::Resumed => String::new(),
        EventKind::StepStarted { step } => format!("step {step}"),
        EventKind::ModelDelta { step, delta } => format!("step {step} {}", delta_fields(delta)),
        EventKind::ModelRetrying {
            step,
            attempt,
            delay_ms,
            reason,
        } => format!(
            "step {step}, retry {attempt} in {delay_ms}ms: {}",
            clip(reason)
        ),
        EventKind::ModelResponded {
            step,
            usage,
            tool_calls,
            from_record,
            refused,
            ..
        } => format!(
            "step {step}, {tool_calls} tool call{}, {} tokens{}{}",
            plural(*tool_calls),
            usage.total_tokens(),
            if *from_record {
                " (from the record)"
            } else {
                ""
            },
            if *refused { " (refused)" } else { "" }
        ),
        EventKind::ToolCalled {
            step,
            tool,
            tool_call_id,
            error,
            ..
        } => match error {
            Some(error) => format!(
                "step {step} {tool} (call {}) failed: {}",
                short.id(tool_call_id),
                clip(error)
            ),
            None => format!("step {step} {tool} (call {})", short.id(tool_call_id)),
        },
        EventKind::ProgramYielded { index, yielded, .. } => {
            format!("yield {index}: {}", clip(&yielded.to_string()))
        }
        EventKind::HistoryRepaired {
            unanswered_calls,
            orphan_results,
        } => format!(
            "dropped {} unanswered call{} and {} orphan result{}",
            unanswered_calls.len(),
            plural(unanswered_calls.len()),
            orphan_results.len(),
            plural(orphan_results.len())
        ),
        EventKind::HistoryCompacted {
            step,
            tokens,
            cut,
            summarized,
            from_record,
            ..
        } => format!(
            "before step {step} at {tokens} tokens: cut {} tool result{}, summarised {summarized} message{}{}",
            cut.len(),
            plural(cut.len()),
            plural(*summarized),
            if *from_record {
                " (from the record)"
            } else {
                ""
            }
        ),
        EventKind::ChildSpawned {
            child_run_id,
            agent_type,
            attempt,
        } => match attempt {
            0 => format!("{agent_type} {}", short.run(child_run_id)),
            n => format!("{agent_type} {} (attempt {n})", short.run(child_run_id)),
        },
        EventKind::ChildRetrying {
            failed_run_id,
            attempt,
            delay_ms,
            error,
        } => format!(
            "{}, attempt {attempt} in {delay_ms}ms: {}",
            short.run(failed_run_id),
            clip(error)
        ),
        EventKind::ChildFinished {
            child_run_id,
            status,
        } => format!("{} {}", short.run(child_run_id), status.as_str()),
        EventKind::BackgroundDelivered { step, child_run_id } => {
            format!(
                "after step {step}, the report of {}",
                short.run(child_run_id)
            )
        }
        EventKind::OutputSet { output } => clip(&output.to_string()),
        EventKind::AgentFinished { state, .. } => quoted(&last_text(state)),
        EventKind::AgentFailed { error, .. } => clip(error),
        EventKind::AgentCancelled { .. } => String::new(),
        EventKind::LimitHit { limit } | EventKind::BudgetReached { limit } => limit.to_string(),
        EventKind::LimitsRaised {
            max_steps,
            max_tokens,
            max_credits,
        } => [
            max_steps.map(|n| format!("max_steps {n}")),
            max_tokens.map(|n| format!("max_tokens {n}")),
            max_credits.map(|n| format!("max_credits {n}")),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", "),
        EventKind::ApprovalRequested {
            step,
            tool_call_id,
            tool,
            input,
        } => format!(
            "step {step} {tool} (call {}) {}",
            short.id(tool_call_id),
            clip(&input.to_string())
        ),
        EventKind::ApprovalDecided {
            step,
            tool_call_id,
            decision,
        } => format!(
            "step {step} call {} {}",
            short.id(tool_call_id),
            match decision {
                Decision::Approve { input: None } => "approved".to_owned(),
                Decision::Approve { input: Some(_) } => "approved with an edited input".to_owned(),
                Decision::Deny { reason } => format!("denied: {}", clip(reason)),
            }
        ),
        EventKind::ApprovalRuleAdded { tool } => format!("{tool} always allowed"),
        EventKind::WorktreeSealed { report } => match &report.error {
            Some(error) => format!(
                "worktree {} could not be sealed: {}",
                report.branch,
                clip(error)
            ),
            None if report.has_changes() => format!(
                "worktree {} kept: {} commit(s), {}",
                report.branch,
                report.commits.len(),
                report.summary
            ),
            None => format!("worktree {} removed: no changes", report.branch),
        },
        EventKind::HookDecided {
            step,
            tool_call_id,
            hook,
            verdict,
        } => format!(
            "step {step} call {} {hook} hooks: {}",
            short.id(tool_call_id),
            if verdict.refuses_call() {
                format!("refused: {}", clip(&verdict.refusal()))
            } else if verdict.updated_input.is_some() {
                "input rewritten".to_owned()
            } else if let Some(p) = verdict.permission {
                format!("{p:?}").to_lowercase()
            } else if verdict.note_for_model().is_some() {
                "context added".to_owned()
            } else {
                "nothing to say".to_owned()
            }
        ),
        EventKind::Steered { step, text } => format!("at step {step}: {}", quoted(text)),
        EventKind::Looping {
            step,
            tool,
            repeats,
            fatal,
        } => format!(
            "step {step} {tool} repeated {repeats} times{}",
            if *fatal { ", stopped" } else { "" }
        ),
        EventKind::Stalled { step, idle_ms } => {
            format!("step {step}, no progress for {idle_ms}ms")
        }
        EventKind::TurnQueued {
            turn,
            position,
            prompt,
        } => format!("turn {turn}, place {position} in line: {}", quoted(prompt)),
    }
}

fn delta_fields(delta: &Delta) -> String {
    match delta {
        Delta::Text { text } => format!("text {}", quoted(text)),
        Delta::Reasoning { text } => format!("reasoning {}", quoted(text)),
        Delta::ToolCallArgs { index, text } => format!("call {index} input {}", quoted(text)),
        Delta::Retry {
            attempt,
            delay_ms,
            reason,
        } => format!("retry {attempt} in {delay_ms}ms: {}", clip(reason)),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `text` in double quotes, clipped; empty when `text` is.
fn quoted(text: &str) -> String {
    if text.is_empty() {
        return String::new();
    }
    format!("\"{}\"", clip(text))
}

/// `text` on one line (line breaks as spaces), cut to [`CLIP`] characters,
/// the cut marked with `…`.
fn clip(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= CLIP {
        return line;
    }
    let mut kept: String = line.chars().take(CLIP - 1).collect();
    kept.push('…');
    kept
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::limit::{Limit, LimitHit};
    use crate::message::Message;
    use crate::model::Usage;
    use crate::state::{AgentState, AgentStatus};

    fn line(kind: EventKind) -> String {
        Event {
            seq: 3,
            tree_id: "t1".parse().unwrap(),
            run_id: "t1/0.2".parse().unwrap(),
            at_ms: 0,
            kind,
        }
        .to_string()
    }

    #[test]
    fn an_event_is_one_line_of_its_run_its_kind_and_its_key_fields() {
        assert_eq!(
            line(EventKind::AgentStarted {
                agent_id: "t1/0.2".parse().unwrap(),
                agent_type: "researcher".into(),
                parent_run_id: Some("t1/0".parse().unwrap()),
                depth: 1,
            }),
            "t1/0.2 agentStarted researcher at depth 1, child of 0"
        );
        assert_eq!(
            line(EventKind::ToolCalled {
                step: 2,
                tool: "word_count".into(),
                tool_call_id: "t1/0.2-s2-c0".into(),
                error: Some("invalid input:\nmissing field `text`".into()),
                result: None,
            }),
            "t1/0.2 toolCalled step 2 word_count (call 0.2-s2-c0) failed: invalid input: missing field `text`"
        );
        assert_eq!(
            line(EventKind::ModelResponded {
                step: 1,
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    ..Usage::default()
                },
                tool_calls: 1,
                reply: None,
                from_record: false,
                refused: false,
            }),
            "t1/0.2 modelResponded step 1, 1 tool call, 15 tokens"
        );
        assert_eq!(
            line(EventKind::LimitHit {
                limit: LimitHit::new(Limit::MaxSteps, "3 of 3"),
            }),
            "t1/0.2 limitHit limit max_steps reached: 3 of 3"
        );
        assert_eq!(
            line(EventKind::ChildSpawned {
                child_run_id: "t1/0.2.1".parse().unwrap(),
                agent_type: "researcher".into(),
                attempt: 1,
            }),
            "t1/0.2 childSpawned researcher 0.2.1 (attempt 1)"
        );
        assert_eq!(
            line(EventKind::ToolCalled {
                step: 1,
                tool: "look".into(),
                tool_call_id: "call_t1".into(),
                error: None,
                result: None,
            }),
            "t1/0.2 toolCalled step 1 look (call call_t1)"
        );
        assert_eq!(
            line(EventKind::ProgramYielded {
                index: 2,
                yielded: serde_json::json!({"toolName": "count", "input": {}}),
                drawn: None,
            }),
            r#"t1/0.2 programYielded yield 2: {"toolName":"count","input":{}}"#
        );
        assert_eq!(line(EventKind::Suspended), "t1/0.2 suspended");
    }

    #[test]
    fn a_finished_run_shows_its_final_text_clipped_to_one_line() {
        let state = AgentState {
            message_history: [
                Message::user("q"),
                Message::assistant_text("word ".repeat(40)),
            ]
            .into_iter()
            .collect(),
            status: AgentStatus::Completed,
            ..AgentState::of_run("t/0".parse().unwrap())
        };
        let text = line(EventKind::AgentFinished {
            state: Arc::new(state),
            inherited: 0,
        });
        assert!(!text.contains('\n'), "{text}");
        assert!(
            text.starts_with("t1/0.2 agentFinished \"word word"),
            "{text}"
        );
        assert!(text.ends_with("…\""), "{text}");
        assert_eq!(
            line(EventKind::OutputSet {
                output: json!({"a": 1}),
            }),
            "t1/0.2 outputSet {\"a\":1}"
        );
    }
}

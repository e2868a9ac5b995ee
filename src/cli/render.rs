//! Renders a tree's events as lines for a terminal: one line per agent start
//! and finish, indented by depth.

use std::collections::HashMap;

use arbor_actors::{AgentState, Event, EventKind, RunId};

use super::runs::count;

/// Turns events into display lines; keeps what it needs to say how long each
/// run took and what it used.
///
/// **Tokens**, here as everywhere Arbor shows them (`arbor tree`, `arbor show`,
/// `/v1/trees`, the live page): the input plus output tokens of a run's own
/// model calls, as the provider reported them (cached input included), not
/// its children's.
#[derive(Default)]
pub struct TreeRenderer {
    started: HashMap<RunId, (u64, usize)>,
    tokens: HashMap<RunId, u64>,
    /// The whole tree's: when its root started, its runs by how they
    /// ended, and every run's tokens, for the summary line.
    tree_started: Option<u64>,
    /// Each agent's last ending (a retried child is one agent, semantics
    /// §1): 0 completed, 1 failed, 2 cancelled.
    ended: HashMap<arbor_actors::AgentId, usize>,
    tree_tokens: u64,
    /// The tree is not stored: `arbor budget` cannot reach it.
    unstored: bool,
}

impl TreeRenderer {
    /// A renderer for a tree that is not stored (`arbor run --no-store`):
    /// a budget pause says that nothing can raise it.
    pub fn unstored() -> Self {
        TreeRenderer {
            unstored: true,
            ..TreeRenderer::default()
        }
    }

    /// The line for `event`, if it is one the tree view shows.
    pub fn line(&mut self, event: &Event) -> Option<String> {
        match &event.kind {
            EventKind::AgentStarted {
                agent_type,
                depth,
                parent_run_id,
                ..
            } => {
                self.started
                    .insert(event.run_id.clone(), (event.at_ms, *depth));
                if *depth == 0 {
                    self.tree_started.get_or_insert(event.at_ms);
                    return Some(format!(
                        "▸ {agent_type} {} (tree {})",
                        event.run_id, event.tree_id
                    ));
                }
                // Lines come in time order, not tree order: each names its
                // parent, so it reads right whatever printed before it.
                let parent = parent_run_id
                    .as_ref()
                    .map(|p| format!(" (parent {})", p.path_text()))
                    .unwrap_or_default();
                Some(format!(
                    "{}▸ {agent_type} {}{parent}",
                    indent(*depth),
                    short(event)
                ))
            }
            EventKind::ModelResponded { usage, .. } => {
                *self.tokens.entry(event.run_id.clone()).or_default() += usage.total_tokens();
                self.tree_tokens += usage.total_tokens();
                None
            }
            EventKind::AgentFinished { state, .. } => {
                Some(self.finished(event, state, 0, "✓", "completed"))
            }
            EventKind::AgentFailed { state, error, .. } => {
                Some(self.finished(event, state, 1, "✗", &format!("failed: {error}")))
            }
            EventKind::AgentCancelled { state, .. } => {
                Some(self.finished(event, state, 2, "○", "cancelled"))
            }
            EventKind::LimitHit { limit } => {
                Some(format!("{}! {} stopped: {limit}", indent(0), short(event)))
            }
            EventKind::Looping {
                tool,
                repeats,
                fatal,
                ..
            } => Some(format!(
                "  ! {} looping: {tool} repeated {repeats} times with the same input and result{}",
                short(event),
                if *fatal { ", stopped" } else { "" }
            )),
            EventKind::Stalled { idle_ms, .. } => Some(format!(
                "  ! {} stalled: no progress for {idle_ms}ms (idle_timeout)",
                short(event)
            )),
            EventKind::ApprovalRequested {
                tool,
                tool_call_id,
                input,
                ..
            } => Some(format!(
                "  ? {} waits for approval: {tool} {} (call {tool_call_id}; arbor approve|deny)",
                short(event),
                clip(&input.to_string(), 61)
            )),
            EventKind::ApprovalDecided {
                tool_call_id,
                decision,
                ..
            } => Some(format!(
                "  ✎ {} {}: call {tool_call_id}",
                short(event),
                match decision {
                    arbor_actors::approval::Decision::Approve { input: None } =>
                        "approved".to_owned(),
                    arbor_actors::approval::Decision::Approve { input: Some(_) } => {
                        "approved with an edited input".to_owned()
                    }
                    arbor_actors::approval::Decision::Deny { reason } =>
                        format!("denied ({reason})"),
                }
            )),
            EventKind::BudgetReached { limit } if self.unstored => Some(format!(
                "  ‖ {} paused: {limit} (the tree is not stored, so no arbor budget can raise it: \
                 Ctrl-C stops it)",
                short(event)
            )),
            EventKind::BudgetReached { limit } => Some(format!(
                "  ‖ {} paused: {limit} (arbor budget {} {} N raises it)",
                short(event),
                event.tree_id,
                raise_flag(limit.limit)
            )),
            EventKind::LimitsRaised { .. } => Some(format!("{}↑ budgets raised", indent(0))),
            EventKind::ApprovalRuleAdded { tool } => Some(format!(
                "{}✓ {tool} always allowed in this tree: its calls run unasked",
                indent(0)
            )),
            EventKind::TurnQueued { turn, position, .. } => Some(format!(
                "{}⋯ turn {turn} queued as {} (place {position} in line)",
                indent(0),
                event.run_id
            )),
            EventKind::Steered { text, .. } => {
                Some(format!("  » {} told: {}", short(event), clip(text, 61)))
            }
            EventKind::BackgroundDelivered { child_run_id, .. } => Some(format!(
                "  ↩ {} got the report of background child {child_run_id}",
                short(event)
            )),
            EventKind::ChildRetrying {
                failed_run_id,
                attempt,
                delay_ms,
                error,
            } => Some(format!(
                "  ↻ retrying {failed_run_id} (attempt {attempt}) in {delay_ms}ms: {error}"
            )),
            _ => None,
        }
    }

    fn finished(
        &mut self,
        event: &Event,
        state: &AgentState,
        how: usize,
        mark: &str,
        what: &str,
    ) -> String {
        let (start, depth) = self
            .started
            .remove(&event.run_id)
            .unwrap_or((event.at_ms, state.depth()));
        let ms = event.at_ms.saturating_sub(start);
        let tokens = self.tokens.remove(&event.run_id).unwrap_or(0);
        self.ended.insert(state.agent_id.clone(), how);
        let line = format!(
            "{}{mark} {} {} {what} in {ms}ms ({}, {})",
            indent(depth),
            state.agent_type.as_deref().unwrap_or("agent"),
            short(event),
            count(state.child_run_ids.len() as u64, "child", "children"),
            count(tokens, "token", "tokens"),
        );
        if depth > 0 {
            return line;
        }
        format!("{line}\n{}", self.summary(event))
    }

    /// The tree's last line, as cargo ends with `Finished`: how long it
    /// ran, its agents by how they ended and the whole tree's tokens (the
    /// root's line shows only its own).
    fn summary(&self, event: &Event) -> String {
        let ms = event
            .at_ms
            .saturating_sub(self.tree_started.unwrap_or(event.at_ms));
        let mut by = [0u64; 3];
        for how in self.ended.values() {
            by[*how] += 1;
        }
        let [done, failed, cancelled] = by;
        let mut how = vec![format!("{done} completed")];
        if failed > 0 {
            how.push(format!("{failed} failed"));
        }
        if cancelled > 0 {
            how.push(format!("{cancelled} cancelled"));
        }
        format!(
            "Finished tree {} in {ms}ms: {} ({}), {} in all",
            event.tree_id,
            count(done + failed + cancelled, "agent", "agents"),
            how.join(", "),
            count(self.tree_tokens, "token", "tokens"),
        )
    }
}

/// The `arbor budget` flag that raises a spent budget.
fn raise_flag(limit: arbor_actors::Limit) -> &'static str {
    super::runs::raise_flag(limit.key())
}

/// The run id without its tree prefix.
fn short(event: &Event) -> arbor_actors::id::PathText<'_> {
    event.run_id.path_text()
}

fn indent(depth: usize) -> String {
    "  ".repeat(depth)
}

/// The text a person wants to read from a root's final state: its structured
/// output if it set one, else the text of its last assistant turn.
pub fn final_text(state: &AgentState) -> String {
    if let Some(output) = &state.output {
        return serde_json::to_string_pretty(output).unwrap_or_else(|_| output.to_string());
    }
    last_text(state)
}

/// The text of a state's last assistant turn (its text parts, joined by
/// newlines); empty when it has none. (The library's, as
/// [`RunResult::text`](arbor_actors::RunResult::text) reads it.)
pub fn last_text(state: &AgentState) -> String {
    arbor_actors::output::last_text(state)
}

/// A state as `arbor run --json` and `arbor show --json` print it: the
/// `AgentState`, with `finalText` beside it: the text of its last assistant
/// turn (what a `last_message` agent hands back and `arbor run` prints),
/// `null` when it has none. (`output` is set only by a structured output.)
pub fn state_json(state: &AgentState) -> serde_json::Result<serde_json::Value> {
    let mut json = serde_json::to_value(state)?;
    if let serde_json::Value::Object(fields) = &mut json {
        let text = last_text(state);
        fields.insert(
            "finalText".to_owned(),
            if text.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::Value::String(text)
            },
        );
    }
    Ok(json)
}

/// `text` on one line (newlines as spaces), cut to `width` characters, the
/// cut marked with `…` (which counts in the width). The CLI's one clip:
/// event lines and the approvals table (`pub` for the `arbor` binary).
pub fn clip(text: &str, width: usize) -> String {
    let line = text.replace('\n', " ");
    if line.chars().count() <= width {
        return line;
    }
    let kept: String = line.chars().take(width.saturating_sub(1)).collect();
    format!("{kept}…")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clip_marks_the_cut_within_the_width() {
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("abcdef", 4), "abc…");
    }

    fn event(kind: EventKind) -> Event {
        Event {
            seq: 1,
            tree_id: "t".parse().unwrap(),
            run_id: "t/0.1".parse().unwrap(),
            at_ms: 0,
            kind,
        }
    }

    #[test]
    fn a_limit_line_names_the_run_it_stopped_and_a_pause_how_to_raise_it() {
        let mut r = TreeRenderer::default();
        let stopped = r
            .line(&event(EventKind::LimitHit {
                limit: arbor_actors::LimitHit::new(arbor_actors::Limit::MaxDepth, "3 of 2"),
            }))
            .unwrap();
        assert_eq!(stopped, "! 0.1 stopped: limit max_depth reached: 3 of 2");
        let paused = r
            .line(&event(EventKind::BudgetReached {
                limit: arbor_actors::LimitHit::new(arbor_actors::Limit::TokenBudget, "9 of 9"),
            }))
            .unwrap();
        assert!(
            paused.ends_with("(arbor budget t --add-tokens N raises it)"),
            "{paused}"
        );
        assert_eq!(count(1, "child", "children"), "1 child");
        assert_eq!(count(0, "child", "children"), "0 children");
    }

    #[test]
    fn the_tree_shows_who_waits_for_a_person_or_a_budget() {
        let mut r = TreeRenderer::default();
        let asked = r
            .line(&event(EventKind::ApprovalRequested {
                step: 1,
                tool_call_id: "c1".into(),
                tool: "fs/write_file".into(),
                input: json!({"path": "a".repeat(200)}),
            }))
            .unwrap();
        assert!(
            asked.contains("waits for approval: fs/write_file"),
            "{asked}"
        );
        assert!(asked.contains("call c1") && asked.contains('…'), "{asked}");
        let denied = r
            .line(&event(EventKind::ApprovalDecided {
                step: 1,
                tool_call_id: "c1".into(),
                decision: arbor_actors::approval::Decision::Deny {
                    reason: "no".into(),
                },
            }))
            .unwrap();
        assert!(denied.contains("denied (no)"), "{denied}");
        let paused = r
            .line(&event(EventKind::BudgetReached {
                limit: arbor_actors::LimitHit::new(arbor_actors::Limit::CostBudget, "2 of 2"),
            }))
            .unwrap();
        assert!(
            paused.contains("paused: limit max_credits reached"),
            "{paused}"
        );
        let told = r
            .line(&event(EventKind::Steered {
                step: 2,
                text: "use metric".into(),
            }))
            .unwrap();
        assert!(told.contains("told: use metric"), "{told}");
        let report = r
            .line(&event(EventKind::BackgroundDelivered {
                step: 2,
                child_run_id: "t/0.3".parse().unwrap(),
            }))
            .unwrap();
        assert!(
            report.contains("report of background child t/0.3"),
            "{report}"
        );
    }
}

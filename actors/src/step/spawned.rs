//! What the machine does with its children's reports: a `spawn_agents`
//! call's reports become its result (each cut to its share of the context
//! window), an inline child's history is merged back into the parent's.

use std::sync::Arc;

use serde_json::Value;

use super::{Action, Catalog, StepMachine};
use crate::history::Expiry;
use crate::message::{INSTRUCTIONS_PROMPT, Message, SPAWN_PROMPT};
use crate::spawn::ChildReport;

impl StepMachine {
    /// Every child of a `spawn_agents` call has reported, in request order.
    pub fn spawn_done(
        &mut self,
        step: u32,
        index: usize,
        reports: Vec<ChildReport>,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        let credits: f64 = reports.iter().map(|r| r.credits).sum();
        let budget = self.report_budget();
        let Some(pending) = self.pending_for(step, index) else {
            return Vec::new();
        };
        // The reports move into the result: a report's value can be a whole
        // subtree's answers, and is neither cloned nor serialised again.
        let mut runs = Vec::with_capacity(reports.len());
        let entries: Vec<Value> = reports
            .into_iter()
            .map(|r| {
                let (entry, run_ids) = r.into_entry(budget);
                runs.extend(run_ids);
                entry
            })
            .collect();
        pending.results[index] = Some(Message::tool_result(
            &pending.calls[index],
            Value::Array(entries),
        ));
        pending.child_runs[index] = runs;
        self.state.credits_used += credits;
        self.resolved(catalog)
    }

    /// The child of a `spawn_agent_inline` call has reported.
    pub fn inline_done(
        &mut self,
        step: u32,
        index: usize,
        report: ChildReport,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        // The parent's own prompt and instructions reached the child as shared
        // messages; only the child's are dropped from the history the parent
        // takes over, and only the child's turn has ended (the parent's
        // messages that live for its turn stay).
        // Told apart by identity, or by value: a child that rewrote the
        // history (`set_messages`, a context pruner) hands back copies of
        // the parent's own.
        let own: Vec<Arc<Message>> = self
            .state
            .message_history
            .iter()
            .filter(|m| {
                m.has_tag(SPAWN_PROMPT)
                    || m.has_tag(INSTRUCTIONS_PROMPT)
                    || crate::history::expired(m, Expiry::TurnEnd)
            })
            .map(Arc::clone)
            .collect();
        let budget = self.report_budget();
        let Some(pending) = self.pending_for(step, index) else {
            return Vec::new();
        };
        let call = &pending.calls[index];
        match (&report.history, report.error_message()) {
            (Some(history), None) => {
                let merged = history.retain(|m| {
                    !(m.has_tag(SPAWN_PROMPT)
                        || m.has_tag(INSTRUCTIONS_PROMPT)
                        || crate::history::expired(m, Expiry::TurnEnd))
                        || own
                            .iter()
                            .any(|o| std::ptr::eq(Arc::as_ptr(o), m) || **o == *m)
                });
                pending.inline = Some((index, merged));
                let credits = report.credits;
                let (entry, run_ids) = report.into_entry(budget);
                pending.results[index] = Some(Message::tool_result(call, entry));
                pending.child_runs[index] = run_ids;
                self.state.credits_used += credits;
            }
            (_, error) => {
                let error = error.unwrap_or("inline agent failed").to_owned();
                pending.results[index] = Some(Message::tool_error(call, error));
                pending.child_runs[index] = report.run_ids;
                self.state.credits_used += report.credits;
            }
        }
        self.resolved(catalog)
    }

    /// The estimated tokens one child's report may take in a spawn result:
    /// the template's `report_share` of what is left of its context window
    /// (`None`: no `context_window`, no cut).
    pub(super) fn report_budget(&self) -> Option<u64> {
        let window = self.template.context_window?;
        let left = window.saturating_sub(self.state.context_token_count);
        Some(self.template.report_share.of(left))
    }
}

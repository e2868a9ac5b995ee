//! Approvals in the step machine (semantics §12): a step with a call that
//! needs a person's decision holds all its calls until every such call is
//! decided; decisions a restart or replay recorded are taken without asking,
//! and a call of a tool a person allowed for good in the tree runs unasked.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Action, Catalog, Pending, StepMachine};
use crate::approval::{DecideRefused, Decision, Gate, gate};
use crate::event::EventKind;
use crate::message::{Content, Message, Part};

/// The calls of a step that wait for decisions, and what they hold back.
#[derive(Default)]
pub(super) struct Held {
    /// Call index → call id, of the calls still waiting for a decision.
    pub(super) waiting: Vec<(usize, String)>,
    /// The step's actions (tools and spawns), started once all are decided.
    pub(super) actions: Vec<Action>,
}

impl StepMachine {
    /// Decisions recorded before a restart (or for a replay), by call id:
    /// taken when the call asks again, without a new event.
    pub fn recover_decisions(&mut self, decisions: HashMap<String, Decision>) {
        if !decisions.is_empty() {
            self.side().recorded_decisions.extend(decisions);
        }
    }

    /// The calls of this step that wait for a decision: (call id, tool, input).
    pub fn awaiting_approval(&self) -> Vec<(String, String, serde_json::Value)> {
        let Some(pending) = &self.pending else {
            return Vec::new();
        };
        pending
            .held
            .waiting
            .iter()
            .filter_map(|(index, id)| {
                let input = held_input(pending, *index)?;
                let tool = self.toolbox.get(&pending.calls[*index].tool_name)?;
                Some((id.clone(), tool.name.clone(), input))
            })
            .collect()
    }

    /// Step 3, for a step whose `needing` calls (by index) wait for
    /// approval: asks for each (or takes its recorded decision) and holds
    /// the step's `actions` until every one is decided.
    pub(super) fn hold_for_approval(
        &mut self,
        mut pending: Pending,
        needing: Vec<usize>,
        actions: Vec<Action>,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        pending.held.actions = actions;
        for index in needing {
            let call = &pending.calls[index];
            let id = call.tool_call_id.clone();
            let recorded = self
                .side
                .as_deref_mut()
                .and_then(|side| side.recorded_decisions.remove(&id));
            let tool = self
                .toolbox
                .get(&call.tool_name)
                .map_or_else(|| call.tool_name.clone(), |e| e.name.clone());
            let always = catalog.always_allowed(&tool) && !pending.forced_asks.contains(&index);
            match gate(recorded, always) {
                Gate::Recorded(decision) => {
                    // Recorded as valid when it was made: it applies as it did.
                    if apply(&mut pending, index, &decision, self).is_ok() {
                        self.show_input_that_runs(&mut pending, index, &decision);
                    }
                    continue;
                }
                Gate::Allowed => continue,
                Gate::Ask => {}
            }
            let input = held_input(&pending, index).unwrap_or_default();
            self.events.push(EventKind::ApprovalRequested {
                step: pending.step,
                tool_call_id: id.clone(),
                tool,
                input,
            });
            pending.held.waiting.push((index, id));
        }
        let waiting = !pending.held.waiting.is_empty();
        let actions = if waiting {
            vec![Action::AwaitApproval]
        } else {
            std::mem::take(&mut pending.held.actions)
        };
        self.pending = Some(Box::new(pending));
        if actions.is_empty() {
            return self.resolved(catalog);
        }
        actions
    }

    /// A person's decision on the waiting call `call_id`: journaled, and
    /// once the step's last decision is in, its calls go on (the actions to
    /// carry out).
    pub fn decide(
        &mut self,
        call_id: &str,
        decision: Decision,
        catalog: &dyn Catalog,
    ) -> Result<Vec<Action>, DecideRefused> {
        if self.state.status.is_final() {
            return Err(DecideRefused::Ended);
        }
        let mut pending = self
            .pending
            .take()
            .ok_or_else(|| DecideRefused::NotPending(call_id.to_owned()))?;
        let Some(at) = pending
            .held
            .waiting
            .iter()
            .position(|(_, id)| id == call_id)
        else {
            self.pending = Some(pending);
            return Err(DecideRefused::NotPending(call_id.to_owned()));
        };
        let index = pending.held.waiting[at].0;
        if let Err(refused) = apply(&mut pending, index, &decision, self) {
            self.pending = Some(pending);
            return Err(refused);
        }
        pending.held.waiting.remove(at);
        self.show_input_that_runs(&mut pending, index, &decision);
        self.events.push(EventKind::ApprovalDecided {
            step: pending.step,
            tool_call_id: call_id.to_owned(),
            decision,
        });
        let actions = if pending.held.waiting.is_empty() {
            std::mem::take(&mut pending.held.actions)
        } else {
            Vec::new()
        };
        let done = pending.held.waiting.is_empty();
        self.pending = Some(pending);
        if done && actions.is_empty() {
            return Ok(self.resolved(catalog));
        }
        Ok(actions)
    }
}

impl StepMachine {
    /// After an approval with an edited input: the step's reply in the
    /// history shows the call with the input that runs, not the model's, so
    /// the model reads its result beside what produced it.
    fn show_input_that_runs(&mut self, pending: &mut Pending, index: usize, decision: &Decision) {
        let Decision::Approve {
            input: Some(edited),
        } = decision
        else {
            return;
        };
        let old = pending.calls.message().clone();
        let id = pending.calls[index].tool_call_id.clone();
        let mut message = Message::clone(&old);
        if let Message::Assistant {
            content: Content::Parts(parts),
            ..
        } = &mut message
        {
            for part in parts {
                if let Part::ToolCall(call) = part
                    && call.tool_call_id == id
                {
                    call.input = edited.into();
                }
            }
        }
        let message = Arc::new(message);
        let history = self.state.message_history.replace(&old, message.clone());
        self.set_history(history);
        pending.calls = super::calls::Calls::of(message);
    }

    /// The template's `approval_timeout` passed while this step's calls
    /// waited: each call still waiting gets `approval_default`, decided as a
    /// person would (its `approvalDecided` event included), in call order.
    /// The actions to carry out once the last is in (none if no call waits).
    pub fn time_out_approvals(&mut self, catalog: &dyn Catalog) -> Vec<Action> {
        let Some(timeout) = self.template().approval_timeout else {
            return Vec::new();
        };
        let default = self.template().approval_default;
        let waiting: Vec<String> = self.pending.as_ref().map_or_else(Vec::new, |p| {
            p.held.waiting.iter().map(|(_, id)| id.clone()).collect()
        });
        let mut actions = Vec::new();
        for id in waiting {
            // The default is the model's own input or a denial: neither is
            // refused while the call waits.
            if let Ok(more) = self.decide(&id, default.decision(timeout), catalog) {
                actions.extend(more);
            }
        }
        actions
    }

    /// Whether a call of this step still waits for a decision.
    pub fn awaits_approval(&self) -> bool {
        self.pending
            .as_ref()
            .is_some_and(|p| !p.held.waiting.is_empty())
    }
}

/// The input the held call `index` would run with.
fn held_input(pending: &Pending, index: usize) -> Option<serde_json::Value> {
    pending.held.actions.iter().find_map(|a| match a {
        Action::RunTool {
            index: i, input, ..
        } if *i == index => Some(input.clone()),
        _ => None,
    })
}

/// Applies a decision to the held call `index`: an edited input replaces the
/// model's (checked against the tool's schema); a denial drops the call and
/// answers the model with the reason.
fn apply(
    pending: &mut Pending,
    index: usize,
    decision: &Decision,
    machine: &StepMachine,
) -> Result<(), DecideRefused> {
    match decision {
        Decision::Approve { input: None } => Ok(()),
        Decision::Approve {
            input: Some(edited),
        } => {
            let call = &pending.calls[index];
            if let Some(entry) = machine.toolbox.get(&call.tool_name) {
                entry
                    .schema
                    .check(edited)
                    .map_err(|e| DecideRefused::InvalidInput(e.to_string()))?;
            }
            for action in &mut pending.held.actions {
                if let Action::RunTool {
                    index: i, input, ..
                } = action
                    && *i == index
                {
                    *input = edited.clone();
                }
            }
            Ok(())
        }
        Decision::Deny { reason } => {
            pending
                .held
                .actions
                .retain(|a| !matches!(a, Action::RunTool { index: i, .. } if *i == index));
            let call = &pending.calls[index];
            pending.results[index] = Some(Message::tool_error(call, Decision::denial(reason)));
            pending.awaiting -= 1;
            Ok(())
        }
    }
}

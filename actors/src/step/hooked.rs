//! `PreToolUse` hooks in the step machine: a step whose calls have hooks
//! holds them (and the step's other work) until the hooks decided, then
//! each call is refused, runs with the input a hook gave it, runs without
//! asking (`allow`), or waits for a person (`ask`, an approval); a call
//! without a permission from its hooks is asked for as its template says.
//! Verdicts are journaled (`hookDecided`), and a resumed or replayed run
//! takes the recorded verdict instead of running the hooks again.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::{Action, Catalog, Pending, StepMachine};
use crate::event::EventKind;
use crate::lifecycle::{HookEvent, Permission, Verdict};
use crate::message::Message;
use crate::tool::Tool;

/// A call that waits for its hooks.
pub(super) struct Hooked {
    index: usize,
    tool: Arc<dyn Tool>,
    input: Value,
    /// Whether its template asks a person before it runs.
    approval: bool,
    /// Its verdict, recorded before a restart.
    recorded: Option<Verdict>,
}

impl Hooked {
    pub(super) fn new(index: usize, tool: Arc<dyn Tool>, input: Value, approval: bool) -> Self {
        Hooked {
            index,
            tool,
            input,
            approval,
            recorded: None,
        }
    }
}

/// The step's calls that wait for their hooks, and what waits with them.
pub(super) struct Hooking {
    calls: Vec<Hooked>,
    /// Calls without hooks that wait for a person (by index).
    needing: Vec<usize>,
    /// The step's other actions, started with the hooked calls.
    actions: Vec<Action>,
}

/// A call whose `PreToolUse` hooks the driver runs.
#[derive(Clone, Debug, PartialEq)]
pub struct HookRequest {
    /// The call's index among the step's tool calls.
    pub index: usize,
    /// The model's call id.
    pub call_id: String,
    /// The tool, by the name templates use.
    pub tool: String,
    /// The call's input, as checked against the tool's schema.
    pub input: Value,
}

impl StepMachine {
    /// `PreToolUse` verdicts recorded before a restart (or for a replay), by
    /// call id: taken when the call comes, without running the hooks.
    pub fn recover_hook_verdicts(&mut self, verdicts: HashMap<String, Verdict>) {
        if !verdicts.is_empty() {
            self.side().recorded_hooks.extend(verdicts);
        }
    }

    /// The model's call id of the current step's `index`-th call.
    pub fn call_id(&self, index: usize) -> Option<String> {
        let pending = self.pending.as_ref()?;
        (index < pending.calls.len()).then(|| pending.calls[index].tool_call_id.clone())
    }

    /// Step 3, for a step with calls that have `PreToolUse` hooks: asks the
    /// driver to run them (those without a recorded verdict), holding the
    /// step's other work.
    pub(super) fn run_hooks(
        &mut self,
        mut pending: Pending,
        mut calls: Vec<Hooked>,
        needing: Vec<usize>,
        actions: Vec<Action>,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        let mut requests = Vec::new();
        for call in &mut calls {
            let id = &pending.calls[call.index].tool_call_id;
            call.recorded = self
                .side
                .as_deref_mut()
                .and_then(|side| side.recorded_hooks.remove(id));
            if call.recorded.is_none() {
                requests.push(HookRequest {
                    index: call.index,
                    call_id: id.clone(),
                    tool: call.tool.name().to_owned(),
                    input: call.input.clone(),
                });
            }
        }
        let step = pending.step;
        pending.hooking = Some(Box::new(Hooking {
            calls,
            needing,
            actions,
        }));
        self.pending = Some(Box::new(pending));
        if requests.is_empty() {
            return self.hooks_done(step, Vec::new(), catalog);
        }
        vec![Action::RunHooks {
            step,
            calls: requests,
        }]
    }

    /// The `PreToolUse` hooks of `step`'s calls decided (`verdicts`, by call
    /// index; a call missing from it had nothing decided): journaled, and
    /// the step goes on with what they allow.
    pub fn hooks_done(
        &mut self,
        step: u32,
        verdicts: Vec<(usize, Verdict)>,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        if self.state.status.is_final() {
            return Vec::new();
        }
        let Some(mut pending) = self.pending.take() else {
            return Vec::new();
        };
        let hooking = match pending.hooking.take() {
            Some(hooking) if pending.step == step => hooking,
            other => {
                pending.hooking = other;
                self.pending = Some(pending);
                return Vec::new();
            }
        };
        let Hooking {
            calls,
            mut needing,
            mut actions,
        } = *hooking;
        let mut verdicts: HashMap<usize, Verdict> = verdicts.into_iter().collect();
        let mut stopped: Option<String> = None;
        for call in calls {
            let index = call.index;
            let tool_call = &pending.calls[index];
            let call_id = tool_call.tool_call_id.clone();
            let verdict = match call.recorded {
                Some(verdict) => verdict,
                None => {
                    let verdict = verdicts.remove(&index).unwrap_or_default();
                    self.events.push(EventKind::HookDecided {
                        step,
                        tool_call_id: call_id.clone(),
                        hook: HookEvent::PreToolUse,
                        verdict: verdict.clone(),
                    });
                    verdict
                }
            };
            if let Some(why) = &verdict.stop {
                stopped.get_or_insert_with(|| why.clone());
            }
            if verdict.refuses_call() {
                pending.results[index] = Some(Message::tool_error(tool_call, verdict.refusal()));
                pending.awaiting -= 1;
                continue;
            }
            let input = match verdict.updated_input {
                None => call.input,
                Some(input) => {
                    let checked = self
                        .toolbox
                        .get(&tool_call.tool_name)
                        .map(|entry| entry.schema.check(&input));
                    if let Some(Err(e)) = checked {
                        pending.results[index] = Some(Message::tool_error(
                            tool_call,
                            format!(
                                "a PreToolUse hook rewrote the input of {}, and the new input is \
                                 invalid: {e}",
                                tool_call.tool_name
                            ),
                        ));
                        pending.awaiting -= 1;
                        continue;
                    }
                    input
                }
            };
            let ask = match verdict.permission {
                Some(Permission::Allow) => false,
                Some(Permission::Ask) => true,
                Some(Permission::Deny) | None => call.approval,
            };
            if ask {
                needing.push(index);
            }
            // A hook's ask is asked even of a tool a person allowed for good.
            if verdict.permission == Some(Permission::Ask) {
                pending.forced_asks.push(index);
            }
            if !verdict.context.is_empty() {
                pending.hook_notes.push((index, verdict.context.join("\n")));
            }
            actions.push(Action::RunTool {
                step,
                index,
                call_id,
                tool: call.tool,
                input,
            });
        }
        // `continue: false` stops the agent: none of the step's calls runs.
        if let Some(why) = stopped {
            self.pending = Some(pending);
            return self.fail(crate::failure::Failure::new(
                crate::failure::FailureKind::Blocked,
                format!("a PreToolUse hook stopped the agent: {why}"),
            ));
        }
        needing.sort_unstable();
        if !needing.is_empty() {
            return self.hold_for_approval(*pending, needing, actions, catalog);
        }
        self.pending = Some(pending);
        if actions.is_empty() {
            return self.resolved(catalog);
        }
        actions
    }

    /// The turn would end: `Stop` (a root) or `SubagentStop` (a child)
    /// hooks decide first, when there are any; a verdict recorded before a
    /// restart is taken instead of running them again.
    pub(super) fn stop_or_complete(&mut self, catalog: &dyn Catalog) -> Vec<Action> {
        let event = self.stop_event();
        let agent_type = self.state.agent_type.clone().unwrap_or_default();
        if !catalog.hooks_at(event, &agent_type) {
            return self.complete();
        }
        let step = self.step;
        let recorded = self
            .side
            .as_deref_mut()
            .and_then(|side| side.recorded_hooks.remove(&stop_key(step)));
        if let Some(verdict) = recorded {
            return self.apply_stop(verdict);
        }
        let last_message = self
            .state
            .message_history
            .last()
            .filter(|m| m.is_assistant())
            .map(|m| m.text())
            .unwrap_or_default();
        // Active once a stop hook kept the run going: the flag, or (a run
        // resumed from a checkpoint) the reason it left in the history.
        let active = self.side.as_deref().is_some_and(|s| s.stop_hook_active)
            || self
                .state
                .message_history
                .iter()
                .skip(self.inherited)
                .any(|m| m.has_tag(STOP_HOOK));
        self.side().stop_hook_step = Some(step);
        vec![Action::RunStopHooks {
            step,
            event,
            last_message,
            active,
        }]
    }

    /// The stop hooks of `step` decided: journaled; a block keeps the agent
    /// going, its reason the next instruction; else the turn ends.
    pub fn stop_hooks_done(&mut self, step: u32, verdict: Verdict) -> Vec<Action> {
        if self.state.status.is_final() {
            return Vec::new();
        }
        let waiting = self
            .side
            .as_deref_mut()
            .and_then(|s| s.stop_hook_step.take());
        if waiting != Some(step) {
            return Vec::new();
        }
        let event = self.stop_event();
        self.events.push(EventKind::HookDecided {
            step,
            tool_call_id: stop_key(step),
            hook: event,
            verdict: verdict.clone(),
        });
        self.apply_stop(verdict)
    }

    /// A root's end runs `Stop` hooks, a child's `SubagentStop` ones.
    fn stop_event(&self) -> HookEvent {
        if self.state.parent_id.is_none() {
            HookEvent::Stop
        } else {
            HookEvent::SubagentStop
        }
    }

    fn apply_stop(&mut self, verdict: Verdict) -> Vec<Action> {
        if verdict.stop.is_none()
            && let Some(reason) = verdict.block
            && self.state.steps_remaining > 0
        {
            self.side().stop_hook_active = true;
            self.state
                .message_history
                .push(Message::user(reason).with_tag(STOP_HOOK));
            return self.begin_step();
        }
        // What came while the hooks ran (a steer, a background report) is
        // answered before the turn ends, as at any other end of a step.
        if self.has_pending_steers() || (self.delivers_now() && self.state.steps_remaining > 0) {
            return self.begin_step();
        }
        self.complete()
    }
}

impl StepMachine {
    /// A run that starts afresh (not from a checkpoint, which holds what
    /// its start hooks added) runs its `UserPromptSubmit` (a root) or
    /// `SubagentStart` (a child) hooks first, when it has any; a verdict
    /// recorded before a restart is taken instead. `None`: go on starting.
    pub(super) fn start_hooks(&mut self, catalog: &dyn Catalog) -> Option<Vec<Action>> {
        if self.resumed || self.step > 0 {
            return None;
        }
        let event = self.start_event();
        let agent_type = self.state.agent_type.clone().unwrap_or_default();
        if !catalog.hooks_at(event, &agent_type) {
            return None;
        }
        let recorded = self
            .side
            .as_deref_mut()
            .and_then(|side| side.recorded_hooks.remove(START_KEY));
        if let Some(verdict) = recorded {
            return Some(self.apply_start(event, verdict, catalog));
        }
        self.side().starting = true;
        // The run's prompt: its last message tagged as one, else its last
        // user message (a machine keeps the prompt itself only for a
        // program).
        let history = &self.state.message_history;
        let prompt = history
            .iter()
            .rev()
            .find(|m| m.has_tag(crate::message::SPAWN_PROMPT))
            .or_else(|| history.iter().rev().find(|m| m.role() == "user"))
            .map(|m| m.text())
            .unwrap_or_default();
        Some(vec![Action::RunStartHooks { event, prompt }])
    }

    /// The start hooks decided: journaled; a `UserPromptSubmit` block (or
    /// stop) fails the run before its model is called, saying why; their
    /// context joins the history before the first step.
    pub fn start_hooks_done(&mut self, verdict: Verdict, catalog: &dyn Catalog) -> Vec<Action> {
        let waiting = self.side.as_deref().is_some_and(|s| s.starting);
        if !waiting || self.state.status.is_final() {
            return Vec::new();
        }
        self.side().starting = false;
        let event = self.start_event();
        self.events.push(EventKind::HookDecided {
            step: 0,
            tool_call_id: START_KEY.to_owned(),
            hook: event,
            verdict: verdict.clone(),
        });
        self.apply_start(event, verdict, catalog)
    }

    /// A root's start runs `UserPromptSubmit` hooks, a child's `SubagentStart` ones.
    fn start_event(&self) -> HookEvent {
        if self.state.parent_id.is_none() {
            HookEvent::UserPromptSubmit
        } else {
            HookEvent::SubagentStart
        }
    }

    fn apply_start(
        &mut self,
        event: HookEvent,
        verdict: Verdict,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        // Claude Code's SubagentStart cannot block; a prompt hook can.
        if event == HookEvent::UserPromptSubmit
            && let Some(why) = verdict.stop.or(verdict.block)
        {
            return self.fail(crate::failure::Failure::new(
                crate::failure::FailureKind::Blocked,
                format!("a UserPromptSubmit hook blocked the prompt: {why}"),
            ));
        }
        if !verdict.context.is_empty() {
            self.state
                .message_history
                .push(Message::user(verdict.context.join("\n")).with_tag(HOOK_CONTEXT));
        }
        self.start_now(catalog)
    }
}

/// The tag of the message a start hook's context gives the agent.
pub const HOOK_CONTEXT: &str = "HOOK_CONTEXT";

/// The key a start hook's verdict is journaled under (in place of a call id).
const START_KEY: &str = "start@0";

/// The tag of the message a stop hook that blocked gives the agent.
pub const STOP_HOOK: &str = "STOP_HOOK";

/// The key a stop hook's verdict is journaled under (in place of a call id).
fn stop_key(step: u32) -> String {
    format!("stop@{step}")
}

//! The end of a step: results appended in call order, the built-ins' effects
//! applied, and the turn goes on, ends, or hands back to the program.

use std::collections::HashSet;
use std::sync::Arc;

use super::{Action, Catalog, Drive, Effect, Origin, StepMachine, fresh_id};
use crate::event::EventKind;
use crate::failure::{Failure, FailureKind};
use crate::handler::{Resume, Yield};
use crate::history::{Expiry, History};
use crate::message::{Message, ToolCall};
use crate::state::AgentStatus;
use crate::toolbox::{END_TURN, SET_OUTPUT};

impl StepMachine {
    /// the built-ins' effects, then decide whether the turn goes on.
    pub(super) fn commit(&mut self, catalog: &dyn Catalog) -> Vec<Action> {
        let Some(p) = self.pending.take() else {
            return Vec::new();
        };
        let results: Vec<Message> = p.results.into_iter().flatten().collect();
        if let Some((inline_index, child_history)) = p.inline {
            let others: Vec<ToolCall> = p
                .calls
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != inline_index)
                .map(|(_, c)| c.clone())
                .collect();
            let mut history = child_history;
            if !others.is_empty() {
                history.push(Message::assistant(None, others));
                for (i, r) in results.iter().enumerate() {
                    if i != inline_index {
                        history.push(r.clone());
                    }
                }
            }
            self.set_history(history);
        } else {
            for r in &results {
                self.state.message_history.push(r.clone());
            }
        }
        for (call, result) in p.calls.iter().zip(&results) {
            self.events.push(EventKind::ToolCalled {
                step: p.step,
                tool: call.tool_name.clone(),
                tool_call_id: call.tool_call_id.clone(),
                error: result
                    .has_tag(crate::message::TOOL_CALL_ERROR)
                    .then(|| result.text()),
            });
        }
        for runs in p.child_runs {
            self.state.child_run_ids.extend(runs);
        }
        if let Some(stopped) = self.watch_loops(p.step, &p.calls, &results) {
            return stopped;
        }
        let mut end_turn = false;
        for (_, effect) in p.effects {
            match effect {
                Effect::Add(m) => self.state.message_history.push(m),
                Effect::Replace(messages) => {
                    let (repaired, _) = messages.into_iter().collect::<History>().repaired();
                    self.set_history(repaired.into_iter().collect());
                }
                Effect::Output(value) => {
                    self.events.push(EventKind::OutputSet {
                        output: value.clone(),
                    });
                    self.state.output = Some(value);
                }
                Effect::EndTurn => end_turn = true,
            }
        }
        if p.origin == Origin::Program {
            // A program's end_turn ends the turn: the program is not resumed.
            if end_turn {
                self.expire(Expiry::TurnEnd);
                return self.complete();
            }
            return self.resume_program(Some(results), false, catalog);
        }
        // A failed set_output does not end the turn: the model reads the error and retries.
        let only_ending = p
            .calls
            .iter()
            .all(|c| c.tool_name == SET_OUTPUT || c.tool_name == END_TURN)
            && !results
                .iter()
                .any(|r| r.has_tag(crate::message::TOOL_CALL_ERROR));
        self.step_committed(end_turn || only_ending, catalog)
    }

    /// A model step is fully recorded; continue, or end the turn.
    pub(super) fn step_committed(
        &mut self,
        turn_ended: bool,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        if turn_ended {
            self.expire(Expiry::TurnEnd);
        }
        match (self.drive, turn_ended) {
            (Drive::Model, false) | (Drive::AllSteps, false) => self.begin_step(),
            // A steer or a background report that arrived during the last
            // step is answered first.
            (Drive::Model, true)
                if self.has_pending_steers()
                    || (self.delivers_now() && self.state.steps_remaining > 0) =>
            {
                self.begin_step()
            }
            (Drive::Model, true) => self.complete(),
            (Drive::OneStep, _) | (Drive::AllSteps, true) => {
                self.resume_program(None, turn_ended, catalog)
            }
            (Drive::ProgramTools, _) => self.fail(Failure::new(
                FailureKind::Internal,
                "internal: model step while a program waits for tools",
            )),
        }
    }

    pub(super) fn complete(&mut self) -> Vec<Action> {
        // A report no step will answer goes straight into the history.
        if self.program.is_some() || self.state.steps_remaining == 0 {
            self.take_all_arrived();
        }
        if let Some(wait) = self.wait_for_background() {
            return wait;
        }
        self.state.status = AgentStatus::Completed;
        vec![Action::Finish]
    }

    pub(super) fn resume_program(
        &mut self,
        results: Option<Vec<Message>>,
        turn_ended: bool,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        let Some(mut program) = self.program.take() else {
            return self.complete();
        };
        let next = match results {
            Some(results) => program.resume(Resume::ToolResults {
                results: results.into_iter().map(Arc::new).collect(),
                state: &self.state,
            }),
            None => program.resume(Resume::StepsDone {
                state: &self.state,
                turn_ended,
            }),
        };
        self.program = Some(program);
        self.follow(next, catalog)
    }

    pub(super) fn follow(&mut self, next: Yield, catalog: &dyn Catalog) -> Vec<Action> {
        match next {
            Yield::Done => {
                self.expire(Expiry::TurnEnd);
                self.complete()
            }
            Yield::Step => {
                self.drive = Drive::OneStep;
                self.begin_step()
            }
            Yield::StepAll => {
                self.drive = Drive::AllSteps;
                self.begin_step()
            }
            Yield::ToolCalls(calls) => {
                if self.state.steps_remaining == 0 {
                    return self.step_limit();
                }
                self.state.steps_remaining -= 1;
                self.step += 1;
                self.drive = Drive::ProgramTools;
                self.events.push(EventKind::StepStarted { step: self.step });
                if calls.is_empty() {
                    // Nothing to run; the step is spent so a looping handler still ends.
                    return self.resume_program(Some(Vec::new()), false, catalog);
                }
                let mut seen = HashSet::new();
                let history = &self.state.message_history;
                let calls: Vec<ToolCall> = calls
                    .into_iter()
                    .enumerate()
                    .map(|(i, (name, input))| ToolCall {
                        tool_call_id: fresh_id(
                            format!("prog-{}-{i}", self.step),
                            history,
                            &mut seen,
                        ),
                        tool_name: name,
                        input,
                    })
                    .collect();
                self.state
                    .message_history
                    .push(Message::assistant(None, calls.clone()));
                self.run_calls(calls, Origin::Program, catalog)
            }
        }
    }
}

//! The end of a step: results appended in call order, the built-ins' effects
//! applied, and the turn goes on, ends, or hands back to the program.

use std::collections::HashSet;
use std::sync::Arc;

use super::{Action, Catalog, Drive, Effect, Origin, StepMachine, fresh_id};
use crate::event::EventKind;
use crate::failure::{Failure, FailureKind};
use crate::handler::{ProgramCall, Resume, Yield};
use crate::history::{Expiry, History};
use crate::message::{Message, ToolCall};
use crate::schema::Schema;
use crate::state::AgentStatus;
use crate::toolbox::{END_TURN, SET_OUTPUT};

/// The tag of the user message that tells a model its native structured
/// reply was refused, and why.
pub const OUTPUT_ERROR: &str = "OUTPUT_ERROR";

/// What becomes of the text of a reply that ends a native structured turn.
#[derive(Clone, Debug, PartialEq)]
pub enum NativeOutput {
    /// It is JSON that fits the output schema: this is the output.
    Accept(serde_json::Value),
    /// It is not: the message the model reads before it tries again.
    Retry(String),
}

/// Decides on the text of a reply that ends a native structured turn: the
/// text (whitespace and one enclosing Markdown code fence, which local
/// models add, taken off) parsed as JSON and checked against `schema` (any
/// object when there is none), as `set_output` checks its input.
pub fn native_output(text: &str, schema: Option<&Schema>) -> NativeOutput {
    let again = "Reply again with only a JSON value that matches the output schema.";
    let body = unfenced(text.trim());
    if body.is_empty() {
        return NativeOutput::Retry(format!(
            "Your reply was empty, but your output is its text. {again}"
        ));
    }
    let value: serde_json::Value = match serde_json::from_str(body) {
        Ok(value) => value,
        Err(e) => {
            return NativeOutput::Retry(format!("Your reply is not valid JSON: {e}. {again}"));
        }
    };
    let any = crate::template::any_object();
    match schema.unwrap_or(&any).check(&value) {
        Ok(()) => NativeOutput::Accept(value),
        Err(e) => NativeOutput::Retry(format!(
            "Your reply does not match the output schema: {e}. {again}"
        )),
    }
}

/// The inside of one code fence (```json ... ```) around the whole text.
fn unfenced(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let Some(inner) = rest.strip_suffix("```") else {
        return text;
    };
    // The info string (`json`) runs to the first line break.
    match inner.split_once('\n') {
        Some((info, body)) if !info.contains(['{', '[', '"']) => body.trim(),
        _ => inner.trim(),
    }
}

impl StepMachine {
    /// the built-ins' effects, then decide whether the turn goes on.
    pub(super) fn commit(&mut self, catalog: &dyn Catalog) -> Vec<Action> {
        let Some(p) = self.pending.take() else {
            return Vec::new();
        };
        // Shared once here: the history, the watchdog and a program's resume
        // all hold the same `Arc`, so no result body is copied.
        let results: Vec<Arc<Message>> = p.results.into_iter().flatten().map(Arc::new).collect();
        // The calls a program kept out of the history, taken for this step
        // alone (an inline spawn's step too: left there, they would hide the
        // next step's results).
        let hidden = self
            .side
            .as_deref_mut()
            .map(|side| std::mem::take(&mut side.hidden_calls))
            .unwrap_or_default();
        if let Some((inline_index, child_history)) = p.inline {
            let shown = |i: usize| i != inline_index && !hidden.contains(&i);
            let others: Vec<ToolCall> = p
                .calls
                .iter()
                .enumerate()
                .filter(|(i, _)| shown(*i))
                .map(|(_, c)| c.clone())
                .collect();
            let mut history = child_history;
            if !others.is_empty() {
                history.push(Message::assistant(None, others));
                for (i, r) in results.iter().enumerate() {
                    if shown(i) {
                        history.push_shared(Arc::clone(r));
                    }
                }
            }
            self.set_history(history);
        } else {
            for (i, r) in results.iter().enumerate() {
                if !hidden.contains(&i) {
                    self.state.message_history.push_shared(Arc::clone(r));
                }
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
                result: self
                    .journals_result(&call.tool_call_id)
                    .then(|| Arc::clone(result)),
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
        self.step_done(end_turn || only_ending, catalog)
    }

    /// A model reply without tool calls is recorded (`turn_ended`: it ends
    /// the turn). A native structured output is that reply's text: accepted,
    /// it is the output; refused, the model reads why and takes another step.
    pub(super) fn step_committed(
        &mut self,
        turn_ended: bool,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        if turn_ended && self.template.native_output() {
            let reply = self
                .state
                .message_history
                .last()
                .filter(|m| m.is_assistant())
                .map(|m| m.text())
                .unwrap_or_default();
            let schema = self.template.output_schema.clone();
            match native_output(&reply, schema.as_ref()) {
                NativeOutput::Accept(value) => {
                    self.events.push(EventKind::OutputSet {
                        output: value.clone(),
                    });
                    self.state.output = Some(value);
                }
                NativeOutput::Retry(error) => {
                    self.state
                        .message_history
                        .push(Message::user(error).with_tag(OUTPUT_ERROR));
                    return self.step_done(false, catalog);
                }
            }
        }
        self.step_done(turn_ended, catalog)
    }

    /// A model step is fully recorded; continue, or end the turn.
    fn step_done(&mut self, turn_ended: bool, catalog: &dyn Catalog) -> Vec<Action> {
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
            (Drive::Model, true) => self.stop_or_complete(catalog),
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
        if let Some(seal) = self.seal_first() {
            return seal;
        }
        self.state.status = AgentStatus::Completed;
        vec![Action::Finish]
    }

    pub(super) fn resume_program(
        &mut self,
        results: Option<Vec<Arc<Message>>>,
        turn_ended: bool,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        let Some(mut program) = self.program.take() else {
            return self.complete();
        };
        self.redraw(&mut *program);
        let next = match results {
            Some(results) => program.resume(Resume::ToolResults {
                results,
                state: &self.state,
            }),
            None => program.resume(Resume::StepsDone {
                state: &self.state,
                turn_ended,
            }),
        };
        let next = self.recorded_yield(&mut *program, next);
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
            Yield::Fail(error) => self.fail(Failure::new(FailureKind::Program, error)),
            Yield::StepText(text) => {
                if self.state.steps_remaining == 0 {
                    return self.step_limit();
                }
                self.state.steps_remaining -= 1;
                self.step += 1;
                self.events.push(EventKind::StepStarted { step: self.step });
                self.state
                    .message_history
                    .push(Message::assistant_text(text));
                self.resume_program(None, false, catalog)
            }
            Yield::ToolCalls(calls) => self.follow(
                Yield::Calls(
                    calls
                        .into_iter()
                        .map(|(name, input)| ProgramCall::new(name, input))
                        .collect(),
                ),
                catalog,
            ),
            Yield::Calls(calls) => {
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
                let mut hidden = Vec::new();
                let calls: Vec<ToolCall> = calls
                    .into_iter()
                    .enumerate()
                    .map(|(i, call)| {
                        if !call.include_in_history {
                            hidden.push(i);
                        }
                        ToolCall {
                            tool_call_id: fresh_id(
                                format!("prog-{}-{i}", self.step),
                                history,
                                &mut seen,
                            ),
                            tool_name: call.name,
                            input: call.input.into(),
                        }
                    })
                    .collect();
                let message = Arc::new(Message::assistant(None, calls));
                if hidden.is_empty() {
                    self.state.message_history.push_shared(message.clone());
                } else {
                    // Only the calls that go into the history are recorded;
                    // `commit` leaves out the others' results.
                    let shown: Vec<ToolCall> = message
                        .tool_calls()
                        .enumerate()
                        .filter(|(i, _)| !hidden.contains(i))
                        .map(|(_, c)| c.clone())
                        .collect();
                    if !shown.is_empty() {
                        self.state
                            .message_history
                            .push(Message::assistant(None, shown));
                    }
                }
                if !hidden.is_empty() {
                    self.side().hidden_calls = hidden;
                }
                self.run_calls(super::calls::Calls::of(message), Origin::Program, catalog)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn score() -> Schema {
        Schema::compile(json!({
            "type": "object",
            "properties": {"score": {"type": "number"}},
            "required": ["score"]
        }))
        .unwrap()
    }

    #[test]
    fn json_that_fits_the_schema_is_the_output() {
        assert_eq!(
            native_output(" {\"score\": 0.5}\n", Some(&score())),
            NativeOutput::Accept(json!({"score": 0.5}))
        );
        assert_eq!(
            native_output("```json\n{\"score\": 1}\n```", Some(&score())),
            NativeOutput::Accept(json!({"score": 1}))
        );
        assert_eq!(
            native_output("```{\"any\": true}```", None),
            NativeOutput::Accept(json!({"any": true}))
        );
    }

    #[test]
    fn text_that_is_not_json_is_sent_back_naming_the_parse_error() {
        let NativeOutput::Retry(why) = native_output("The score is 0.5", Some(&score())) else {
            panic!("accepted prose");
        };
        assert!(why.starts_with("Your reply is not valid JSON: "), "{why}");
        assert!(why.contains("line 1 column"), "{why}");
        let NativeOutput::Retry(empty) = native_output("  ", Some(&score())) else {
            panic!("accepted nothing");
        };
        assert!(empty.contains("empty"), "{empty}");
    }

    #[test]
    fn json_that_misses_the_schema_is_sent_back_naming_the_path() {
        let NativeOutput::Retry(why) = native_output("{\"score\": \"high\"}", Some(&score()))
        else {
            panic!("accepted a string score");
        };
        assert!(
            why.starts_with("Your reply does not match the output schema: at /score"),
            "{why}"
        );
        // Without a schema the output is any object, as set_output's input.
        assert!(matches!(
            native_output("[1, 2]", None),
            NativeOutput::Retry(_)
        ));
    }
}

//! Programmatic agents (semantics §4.5): a template's step handler drives the agent
//! by yielding tool calls or handing control to the model for one step or a turn.
//!
//! A handler runs inside the agent actor between messages, so it must not block.
//! Its tool batches cost one step each, like model steps, and it is cancelled with
//! the agent. A panic in a handler fails the agent, never the process.

use std::sync::Arc;

use serde_json::Value;

use crate::message::Message;
use crate::state::AgentState;

/// What a program is told when it resumes.
pub enum Resume<'a> {
    /// The run begins.
    Start {
        /// The run's prompt, if it was given one.
        prompt: Option<&'a str>,
        /// The run's params, if it was given any.
        params: Option<&'a Value>,
        /// The run's state as it starts.
        state: &'a AgentState,
    },
    /// The tool calls it yielded have run; their results, in call order.
    ToolResults {
        /// One tool result message per call.
        results: Vec<Arc<Message>>,
        /// The run's state.
        state: &'a AgentState,
    },
    /// The model step(s) it asked for are done.
    StepsDone {
        /// The run's state after them.
        state: &'a AgentState,
        /// Whether the model ended its turn (`end_turn`, or a reply without tool calls).
        turn_ended: bool,
    },
}

/// What a program asks for next.
#[derive(Clone, Debug, PartialEq)]
pub enum Yield {
    /// Run these tools (name, input), in order, as one step; each call and
    /// its result go into the history.
    ToolCalls(Vec<(String, Value)>),
    /// Run these tools, in order, as one step, each saying whether its call
    /// and result go into the history (Codebuff's `includeToolCall`).
    Calls(Vec<ProgramCall>),
    /// Let the model take one step.
    Step,
    /// Let the model run to the end of its turn.
    StepAll,
    /// Put this text into the history as the model's reply, without a model
    /// call, and resume as after a step that did not end the turn
    /// (Codebuff's `{ type: 'STEP_TEXT', text }`).
    StepText(String),
    /// Finish the run.
    Done,
    /// The program failed: the run fails with this error, which its parent reads.
    Fail(String),
}

/// One tool call a program yields.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramCall {
    /// The tool's name.
    pub name: String,
    /// Its input.
    pub input: Value,
    /// Whether the call and its result go into the history (`false`: the
    /// tool runs and its effects apply, but neither message is kept, as
    /// Codebuff's `includeToolCall: false`).
    pub include_in_history: bool,
}

impl ProgramCall {
    /// A call that goes into the history.
    pub fn new(name: impl Into<String>, input: Value) -> Self {
        Self {
            name: name.into(),
            input,
            include_in_history: true,
        }
    }
}

/// One run of a programmatic agent.
pub trait StepProgram: Send {
    /// Takes what happened since the last yield and says what comes next.
    fn resume(&mut self, input: Resume<'_>) -> Yield;

    /// What the program drew, during its last [`resume`](Self::resume),
    /// from sources that differ from run to run (a clock, a random seed):
    /// journaled with the yield it made, and given back by
    /// [`redraw`](Self::redraw) when the run is resumed or replayed.
    /// `None` (the default) when it drew nothing.
    fn drawn(&mut self) -> Option<Value> {
        None
    }

    /// Before a resume that a resumed or replayed run makes again: what the
    /// same resume drew the first time ([`drawn`](Self::drawn)), to be drawn
    /// again instead of read from the sources. The default ignores it.
    fn redraw(&mut self, drawn: Value) {
        let _ = drawn;
    }
}

/// Makes a program for each run of a template.
pub trait StepHandler: Send + Sync {
    /// The program of a new run.
    fn start(&self) -> Box<dyn StepProgram>;
}

/// A handler from a closure that builds each run's program.
pub struct FnHandler<F>(pub F);

impl<F, P> StepHandler for FnHandler<F>
where
    F: Fn() -> P + Send + Sync,
    P: StepProgram + 'static,
{
    fn start(&self) -> Box<dyn StepProgram> {
        Box::new((self.0)())
    }
}

/// A program from a closure over its inputs.
pub struct FnProgram<F>(pub F);

impl<F> StepProgram for FnProgram<F>
where
    F: FnMut(Resume<'_>) -> Yield + Send,
{
    fn resume(&mut self, input: Resume<'_>) -> Yield {
        (self.0)(input)
    }
}

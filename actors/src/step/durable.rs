//! A program's run held to its record (issue 37): each yield journaled in a
//! durable tree, and in a resumed or replayed run compared with the one
//! recorded at its place, the program given back what it drew, and its
//! tools' recorded results served instead of running them again.

use crate::durable::{ProgramRecord, divergence, yield_value};
use crate::event::EventKind;
use crate::handler::{StepProgram, Yield};
use crate::message::Message;

use super::StepMachine;

/// A program's yields so far, and the record it is held to.
#[derive(Default)]
pub(super) struct Durable {
    /// Yields made so far (the next one's index is one more).
    made: u32,
    /// What the run did before it was resumed (empty for a new run).
    record: ProgramRecord,
}

impl StepMachine {
    /// Gives a resumed or replayed run of a program what its journal
    /// recorded: its program's yields are held to it, and its tools'
    /// recorded results are served instead of running them again.
    pub fn recover_program(&mut self, record: ProgramRecord) {
        if record.is_empty() {
            return;
        }
        self.side().durable = Some(Box::new(Durable { made: 0, record }));
    }

    fn durable(&self) -> Option<&Durable> {
        self.side
            .as_deref()
            .and_then(|side| side.durable.as_deref())
    }

    /// Before the program is resumed: what it drew on its way to its next
    /// yield the first time, to draw again.
    pub(super) fn redraw(&self, program: &mut dyn StepProgram) {
        let Some(durable) = self.durable() else {
            return;
        };
        if let Some(drawn) = durable
            .record
            .yield_at(durable.made + 1)
            .and_then(|y| y.drawn.clone())
        {
            program.redraw(drawn);
        }
    }

    /// After it: its yield journaled (a durable tree), or held to its
    /// record (a resumed or replayed run), where a yield that differs fails
    /// the run naming both.
    pub(super) fn recorded_yield(&mut self, program: &mut dyn StepProgram, next: Yield) -> Yield {
        let drawn = program.drawn();
        if matches!(next, Yield::Fail(_)) || (!self.checkpointing && self.durable().is_none()) {
            return next;
        }
        let done = matches!(next, Yield::Done);
        let durable = self.side().durable.get_or_insert_default();
        let index = durable.made + 1;
        if !done {
            durable.made = index;
        }
        let value = yield_value(&next);
        if let Some(recorded) = durable.record.yield_at(index) {
            return match divergence(index, &recorded.yielded, &value) {
                Some(error) => Yield::Fail(error),
                // Journaled the first time.
                None => next,
            };
        }
        if !done && self.checkpointing {
            self.events.push(EventKind::ProgramYielded {
                index,
                yielded: value,
                drawn,
            });
        }
        next
    }

    /// The result the journal recorded for the call `call_id` of this run.
    pub(super) fn recorded_result(&self, call_id: &str) -> Option<&Message> {
        self.durable()
            .and_then(|d| d.record.results.get(call_id))
            .map(|m| m.as_ref())
    }

    /// Whether the result of the call `call_id` is journaled with its
    /// `toolCalled` event: a program's, in a durable tree, unless it came
    /// from the record.
    pub(super) fn journals_result(&self, call_id: &str) -> bool {
        self.checkpointing
            && self.template.handler.is_some()
            && self.recorded_result(call_id).is_none()
    }
}

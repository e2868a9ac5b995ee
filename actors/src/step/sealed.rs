//! Sealing a run's worktree as it completes (issue 36, [`crate::worktree`]):
//! the machine asks its driver once, waits for the report, journals it
//! (`worktreeSealed`) and puts it in the state; a resumed or replayed run
//! takes the recorded report instead. A run that ends failed or cancelled
//! is sealed too, once its work has stopped ([`StepMachine::end_seal`]):
//! what it changed stays on its branch, named in its final state, and a
//! worktree it left clean is removed.

use super::{Action, StepMachine};
use crate::event::EventKind;
use crate::worktree::{Isolation, WorktreeReport};

impl StepMachine {
    /// The worktree report a resumed or replayed run recorded: taken when
    /// the run completes, without sealing again.
    pub fn recover_worktree(&mut self, report: WorktreeReport) {
        self.side().recorded_worktree = Some(report);
    }

    /// The run would complete: an isolated run seals its worktree first.
    /// `None`: nothing to seal (any more), go on completing.
    pub(super) fn seal_first(&mut self) -> Option<Vec<Action>> {
        if self.template.isolation != Isolation::Worktree || self.state.worktree.is_some() {
            return None;
        }
        let side = self.side();
        if side.sealed {
            return None;
        }
        if side.sealing {
            return Some(Vec::new());
        }
        if let Some(report) = side.recorded_worktree.take() {
            side.sealed = true;
            self.state.worktree = Some(Box::new(report));
            return None;
        }
        side.sealing = true;
        Some(vec![Action::SealWorktree])
    }

    /// A run that ended (failed or cancelled) before its worktree was
    /// sealed: asked by the driver once the run's tasks are stopped and its
    /// children have ended, so the seal sees all the run did.
    pub fn end_seal(&mut self) -> EndSeal {
        if self.template.isolation != Isolation::Worktree
            || self.state.worktree.is_some()
            || !self.state.status.is_final()
        {
            return EndSeal::Done;
        }
        let side = self.side();
        if side.sealed {
            return EndSeal::Done;
        }
        if side.sealing {
            return EndSeal::Wait;
        }
        if let Some(report) = side.recorded_worktree.take() {
            side.sealed = true;
            self.state.worktree = Some(Box::new(report));
            return EndSeal::Done;
        }
        side.sealing = true;
        EndSeal::Start
    }

    /// The worktree was sealed (`None`: there was none to seal, the agent
    /// never used its workspace): journaled, then the run completes.
    pub fn worktree_sealed(&mut self, report: Option<WorktreeReport>) -> Vec<Action> {
        let side = self.side();
        if !side.sealing {
            return Vec::new();
        }
        side.sealing = false;
        side.sealed = true;
        if let Some(report) = report {
            self.events.push(EventKind::WorktreeSealed {
                report: report.clone(),
            });
            self.state.worktree = Some(Box::new(report));
        }
        if self.state.status.is_final() {
            return Vec::new();
        }
        self.complete()
    }
}

/// What an ended run's driver does about its worktree before it finishes.
#[derive(Debug, PartialEq, Eq)]
pub enum EndSeal {
    /// Nothing (left) to seal: finish.
    Done,
    /// Seal it now, then finish when the report arrives.
    Start,
    /// A seal is under way: finish when its report arrives.
    Wait,
}

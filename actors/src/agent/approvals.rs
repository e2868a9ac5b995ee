//! The approval timer (semantics §12, `approval_timeout`): when a step's
//! calls have waited the template's timeout for decisions, each one still
//! waiting gets its `approval_default`, decided by the machine as a person's
//! decision would be (an `approvalDecided` event, recorded for a restart or a
//! replay).
//!
//! The timer starts when the actor carries out `Action::AwaitApproval` and
//! stops once the step's last decision is in (or the run ends). It is a task
//! that sends `ApprovalTimeout`, tagged with the step and a generation like
//! the step timer, so a timer already stopped does nothing. A restarted run
//! asks again and so starts a new wait: the timeout counts from the restart.

use ractor::ActorRef;

use super::{AgentMsg, AgentRun, Parked, Phase};
use crate::step::{Action, Catalog};

impl AgentRun {
    /// The step's calls wait for decisions: start the template's timer (if
    /// it has one), replacing any earlier one.
    pub(super) fn start_approval_timer(&mut self, myself: &ActorRef<AgentMsg>) {
        let Some(timeout) = self.machine.template().approval_timeout else {
            return;
        };
        let step = self.machine.step();
        let at = tokio::time::Instant::now() + timeout;
        self.approval_timer
            .start_at(myself, at, move |generation| AgentMsg::ApprovalTimeout {
                step,
                generation,
            });
    }

    pub(super) fn stop_approval_timer(&mut self) {
        self.approval_timer.stop();
    }

    /// The timer fired: the calls still waiting get the default decision
    /// (nothing if the timer is stale, or no call waits any more).
    pub(super) fn approval_timeout(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        step: u32,
        generation: u64,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        if step != self.machine.step() || !self.approval_timer.fired(generation) {
            return Vec::new();
        }
        let actions = self.machine.time_out_approvals(catalog);
        self.decided(myself, actions)
    }

    /// After a decision: once the step's last one is in, the timer stops,
    /// and calls to run wait for a live slot if the agent gave its own back.
    pub(super) fn decided(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        actions: Vec<Action>,
    ) -> Vec<Action> {
        if !self.machine.awaits_approval() {
            self.stop_approval_timer();
        }
        let runs_calls = actions.iter().any(|a| {
            matches!(
                a,
                Action::RunTool { .. } | Action::SpawnAgents { .. } | Action::SpawnInline { .. }
            )
        });
        if runs_calls && matches!(self.phase, Phase::Suspended { .. }) {
            self.park(myself, Parked::Actions(actions));
            Vec::new()
        } else {
            actions
        }
    }
}

//! The one kind of timer an agent actor has (its step timeout, its approval
//! timeout, its idle watchdog): a task that sends the actor a message at an
//! instant, tagged with a generation. Starting it again or stopping it makes
//! every message already on its way stale, so a late one does nothing.

use ractor::ActorRef;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use std::time::Duration;

use super::AgentMsg;
use crate::event::EventKind;
use crate::limit::{Limit, LimitHit};
use crate::step::Action;

/// A restartable, generation-tagged timer (see the module's text).
#[derive(Default)]
pub(super) struct Timer {
    generation: u64,
    task: Option<JoinHandle<()>>,
}

impl Timer {
    /// Starts the timer (stopping a running one): at `at`, the actor gets
    /// `message(generation)`.
    pub(super) fn start_at(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        at: Instant,
        message: impl FnOnce(u64) -> AgentMsg + Send + 'static,
    ) {
        self.stop();
        self.generation += 1;
        let generation = self.generation;
        let me = myself.clone();
        self.task = Some(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let _ = me.cast(message(generation));
        }));
    }

    /// Stops it: a message already sent is stale.
    pub(super) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Whether it runs.
    pub(super) fn is_running(&self) -> bool {
        self.task.is_some()
    }

    /// The message of `generation` came: whether it is from this timer as it
    /// runs now (it then no longer runs), not a stale one.
    pub(super) fn fired(&mut self, generation: u64) -> bool {
        if self.task.is_some() && generation == self.generation {
            self.task = None;
            true
        } else {
            false
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The step timeout of an agent.
impl super::AgentRun {
    pub(super) fn start_timer(&mut self, myself: &ActorRef<AgentMsg>, step: u32) {
        let Some(timeout) = self.machine.template().step_timeout else {
            return;
        };
        let at = tokio::time::Instant::now() + timeout;
        self.timer
            .start_at(myself, at, move |generation| AgentMsg::StepTimeout {
                step,
                generation,
            });
    }

    pub(super) fn stop_timer(&mut self) {
        self.timer.stop();
    }

    pub(super) fn step_timeout(&mut self, step: u32, generation: u64) -> Vec<Action> {
        if step != self.machine.step() || !self.timer.fired(generation) {
            return Vec::new();
        }
        let timeout = self
            .machine
            .template()
            .step_timeout
            .unwrap_or(Duration::ZERO);
        let limit = LimitHit::new(
            Limit::StepTimeout,
            format!("step {step} took longer than {timeout:?}"),
        );
        self.emit(EventKind::LimitHit {
            limit: limit.clone(),
        });
        self.machine.fail(limit)
    }
}

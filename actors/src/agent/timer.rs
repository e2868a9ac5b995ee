//! The one kind of timer an agent actor has (its step timeout, its approval
//! timeout, its idle watchdog): a task that sends the actor a message at an
//! instant, tagged with a generation. Starting it again or stopping it makes
//! every message already on its way stale, so a late one does nothing.

use ractor::ActorRef;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::AgentMsg;

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

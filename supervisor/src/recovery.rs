//! What a resumed or replayed tree starts from: the stored final states of runs
//! that finished, the last checkpoint of runs that were cut short, and the
//! recorded model replies, served instead of calling the model again.

use std::collections::HashMap;
use std::sync::Arc;

use arbor_actors::approval::{AlwaysAllowed, Decision};
use arbor_actors::background::Scheduled;
use arbor_actors::durable::ProgramRecord;
use arbor_actors::steer::Steer;
use arbor_actors::{
    AgentState, Checkpoint, DeltaSink, Message, Model, ModelError, ModelRequest, ModelResponse,
    Recovered, RunId, Usage, UsageSource,
};
use async_trait::async_trait;

/// A model reply as the store recorded it.
#[derive(Clone, Debug)]
pub struct RecordedReply {
    /// The assistant message the model replied with.
    pub message: Arc<Message>,
    /// What the call used (tokens, credits).
    pub usage: Usage,
}

/// The recorded replies of one tree, by run id and step.
pub type Tape = HashMap<(String, u32), RecordedReply>;

/// What the tree had spent when it stopped (so its limits hold across a restart).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spent {
    /// Agents the tree admitted, the root included (a retry is the same agent).
    pub agents: usize,
    /// Model steps that are not taken again: every step of a finished run,
    /// and a cut-short run's steps up to its checkpoint.
    pub steps: u64,
    /// Input and output tokens of those steps.
    pub tokens: u64,
    /// Credits those steps cost.
    pub credits: f64,
}

/// Everything a resumed tree knows of its previous life.
#[derive(Clone, Debug, Default)]
pub struct Recovery {
    /// Runs that finished: they are merged, never run again.
    pub finished: HashMap<String, (Arc<AgentState>, usize)>,
    /// Runs that were cut short: each goes on from its last checkpoint.
    pub checkpoints: HashMap<String, Arc<Checkpoint>>,
    /// The model replies recorded, served instead of calling the model again.
    pub replies: Tape,
    /// The last event number the tree used; new events follow it.
    pub last_seq: u64,
    /// What the tree had spent, which its budget goes on from.
    pub spent: Spent,
    /// Every run the log has, ended or not.
    pub runs: Vec<String>,
    /// The store's ids of the messages above (so a resumed tree does not write
    /// them again).
    pub message_ids: Vec<(Arc<Message>, u64)>,
    /// Every run's `steered` events, in order (semantics §9).
    pub steers: HashMap<String, Vec<Steer>>,
    /// Every run's `backgroundDelivered` events, in order (semantics §15).
    pub deliveries: HashMap<String, Vec<Scheduled>>,
    /// Every run's decisions on tool calls, by call id (semantics §12).
    pub decisions: HashMap<String, HashMap<String, Decision>>,
    /// Every run's `PreToolUse` verdicts, by call id (issue 36).
    pub hook_verdicts: HashMap<String, HashMap<String, arbor_actors::lifecycle::Verdict>>,
    /// Every isolated run's sealed worktree (issue 36).
    pub worktrees: HashMap<String, arbor_actors::worktree::WorktreeReport>,
    /// Every program run's yields and tool results (issue 37): a program
    /// started again is held to them.
    pub programs: HashMap<String, ProgramRecord>,
    /// Every run's compactions (`historyCompacted`, issue 37): applied
    /// again at their steps, with no summary call.
    pub compactions: HashMap<String, Vec<arbor_actors::compact::Compacted>>,
    /// The tree's budgets as raised while it ran (semantics §13).
    pub raised: crate::Raised,
    /// The calls asked for and not decided, by call id: their run and when
    /// they were first asked for (ms since the Unix epoch), so a call asked
    /// for again after a restart keeps its age (semantics §12).
    pub asked: HashMap<String, (String, u64)>,
    /// The tools a person allowed for good in the tree ("always allow",
    /// semantics §12): their calls still run without asking.
    pub allowed: AlwaysAllowed,
    /// Whether this is a replay (steers are sent again at their steps) rather
    /// than a resume (steers no checkpoint holds are given back).
    pub replaying: bool,
}

impl Recovery {
    /// A replay: only the recorded replies, every run starts afresh.
    /// A replay of what `recorded` (a store's recovery of the tree) holds:
    /// only its replies, steers and decisions; every run starts afresh.
    pub(crate) fn replay(recorded: Recovery) -> Self {
        Recovery {
            replies: recorded.replies,
            steers: recorded.steers,
            deliveries: recorded.deliveries,
            decisions: recorded.decisions,
            hook_verdicts: recorded.hook_verdicts,
            // Made again from the record: a replay never calls the model.
            compactions: recorded.compactions,
            // Held to their yields and drawing again what they drew, but
            // running their tools again, as every run of a replay does.
            programs: recorded
                .programs
                .into_iter()
                .map(|(run, record)| {
                    let yields = ProgramRecord {
                        yields: record.yields,
                        ..ProgramRecord::default()
                    };
                    (run, yields)
                })
                .collect(),
            // Worktrees are sealed again, for real: a replay runs the
            // tools again, and sealing the same work makes the same commit.
            // A call that ran by a rule runs unasked again.
            allowed: recorded.allowed,
            // A replay starts with the budgets the tree ended with: it never
            // pauses where the live tree waited to be raised.
            raised: recorded.raised,
            replaying: true,
            ..Recovery::default()
        }
    }

    /// The `PreToolUse` verdicts recorded for the run `run_id`'s tool calls.
    pub(crate) fn hook_verdicts_for(
        &self,
        run_id: &RunId,
    ) -> HashMap<String, arbor_actors::lifecycle::Verdict> {
        self.hook_verdicts
            .get(&*run_id.to_string())
            .cloned()
            .unwrap_or_default()
    }

    /// What the program run `run_id` recorded, if anything.
    pub(crate) fn program_for(&self, run_id: &RunId) -> Option<ProgramRecord> {
        self.programs.get(&*run_id.to_string()).cloned()
    }

    /// Starts every program of a resumed tree that has not finished over
    /// (`arbor resume --restart-programs`): their records are dropped, and
    /// with them the model replies recorded for their runs, which a program
    /// started over asks for again.
    pub fn restart_programs(&mut self) {
        let restarted: Vec<String> = self
            .programs
            .keys()
            .filter(|run| !self.finished.contains_key(*run))
            .cloned()
            .collect();
        for run in &restarted {
            self.programs.remove(run);
        }
        self.replies.retain(|(run, _), _| !restarted.contains(run));
    }

    /// The decisions recorded for the run `run_id`'s tool calls.
    pub(crate) fn decisions_for(&self, run_id: &RunId) -> HashMap<String, Decision> {
        self.decisions
            .get(&*run_id.to_string())
            .cloned()
            .unwrap_or_default()
    }

    /// What the run `run_id` gets back of its steers: in a replay, every one;
    /// in a resume, those after its last checkpoint (a checkpoint at step `c`
    /// holds every steer that arrived up to step `c`).
    pub(crate) fn steers_for(&self, run: &RunId) -> Vec<Steer> {
        let run_id = &*run.to_string();
        let Some(steers) = self.steers.get(run_id) else {
            return Vec::new();
        };
        if self.replaying {
            return steers.clone();
        }
        if self.finished.contains_key(run_id) {
            return Vec::new();
        }
        let after = self.checkpoints.get(run_id).map_or(0, |c| c.step);
        steers.iter().filter(|s| s.step > after).cloned().collect()
    }

    /// Where the run `run_id` takes its background reports: in a replay,
    /// every delivery it made; in a resume, those after its last checkpoint
    /// (a checkpoint at step `c` holds the reports delivered up to `c`).
    pub(crate) fn deliveries_for(&self, run: &RunId) -> Vec<Scheduled> {
        let run_id = &*run.to_string();
        let Some(deliveries) = self.deliveries.get(run_id) else {
            return Vec::new();
        };
        if self.replaying {
            return deliveries.clone();
        }
        if self.finished.contains_key(run_id) {
            return Vec::new();
        }
        let after = self.checkpoints.get(run_id).map_or(0, |c| c.step);
        deliveries
            .iter()
            .filter(|d| d.step > after)
            .cloned()
            .collect()
    }

    pub(crate) fn recovered(&self, run: &RunId) -> Option<Recovered> {
        let run_id = &*run.to_string();
        if let Some((state, inherited)) = self.finished.get(run_id) {
            return Some(Recovered::Finished {
                state: state.clone(),
                inherited: *inherited,
            });
        }
        self.checkpoints
            .get(run_id)
            .map(|c| Recovered::Checkpoint(c.clone()))
    }
}

/// Serves recorded replies by run id and step; anything else goes to `live`,
/// or fails when there is no live model (a replay must not reach the network).
pub(crate) struct Recorded {
    pub(crate) name: String,
    /// The tree's recovery, whose `replies` are served (shared, not copied).
    pub(crate) recovery: Arc<Recovery>,
    pub(crate) live: Option<Arc<dyn Model>>,
}

#[async_trait]
impl Model for Recorded {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(
        &self,
        request: ModelRequest,
        deltas: DeltaSink,
    ) -> Result<ModelResponse, ModelError> {
        let key = (request.meta.run_id.clone(), request.meta.step);
        // A summary call (`compact_at`) is no step's reply: a recorded one
        // is applied from its `historyCompacted` event without a call.
        let recorded = (!request.meta.summary)
            .then(|| self.recovery.replies.get(&key))
            .flatten();
        if let Some(reply) = recorded {
            // Marked as served from the record: its event counts nothing
            // again (the record was counted when it was written).
            return Ok(ModelResponse {
                message: (*reply.message).clone(),
                usage: Usage {
                    source: UsageSource::Recorded,
                    ..reply.usage
                },
            });
        }
        match &self.live {
            Some(model) => model.complete(request, deltas).await,
            None => Err(ModelError::Invalid {
                model: self.name.clone(),
                message: format!(
                    "no recorded reply for run {} step {} (replay never calls the model)",
                    key.0, key.1
                ),
            }),
        }
    }
}

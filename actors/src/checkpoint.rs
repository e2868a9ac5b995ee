//! What a run needs to go on after a crash: its state at a step boundary plus the
//! few counters of its machine. The supervisor's store keeps them; a resumed run
//! starts from the last one (semantics: "durable runs" in ARCHITECTURE.md).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::id::RunId;
use crate::state::AgentState;

/// A model-driven run's state at a step boundary: taken just before step
/// `step + 1` asks the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// Model steps taken before this point.
    pub step: u32,
    /// Children spawned before this point (the next child's ordinal follows it).
    pub children_spawned: u32,
    /// Messages the run inherited from its parent (for its output, semantics §7).
    pub inherited: usize,
    /// The run's state at this point.
    pub state: AgentState,
}

/// What the tree already knows of a run it is about to start again.
#[derive(Clone, Debug)]
pub enum Recovered {
    /// The run finished before: its final state is merged, it does not run again.
    Finished {
        /// Its final state.
        state: Arc<AgentState>,
        /// Messages of that state's history the run inherited (for its output).
        inherited: usize,
    },
    /// The run was cut short: it goes on from its last checkpoint.
    Checkpoint(Arc<Checkpoint>),
}

/// A background report's delivery as a run's journal recorded it (its
/// `backgroundDelivered` event): a resumed or replayed run takes the report
/// at the same boundary (semantics §15).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    /// The step the run had taken when the report joined its history.
    pub step: u32,
    /// The child's last run id.
    pub child_run_id: RunId,
}

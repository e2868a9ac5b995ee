//! The closed set of things that happen in a tree. Events are the only way the
//! world learns what an agent did: the CLI, logs, stores and streams subscribe.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::checkpoint::Checkpoint;
use crate::limit::LimitHit;
use crate::message::Message;
use crate::model::{Delta, Usage};
use crate::state::{AgentState, AgentStatus};

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Position in the tree's event sequence, from 1.
    pub seq: u64,
    pub tree_id: Arc<str>,
    /// The run the event is about.
    pub run_id: Arc<str>,
    /// Wall-clock milliseconds since the Unix epoch.
    pub at_ms: u64,
    #[serde(flatten)]
    pub kind: EventKind,
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "camelCase")]
#[non_exhaustive]
pub enum EventKind {
    #[serde(rename_all = "camelCase")]
    AgentStarted {
        agent_id: String,
        agent_type: String,
        parent_run_id: Option<String>,
        depth: usize,
    },
    /// The run's state at a step boundary (only in a durable tree).
    Checkpointed {
        checkpoint: Arc<Checkpoint>,
    },
    StepStarted {
        step: u32,
    },
    ModelDelta {
        step: u32,
        delta: Delta,
    },
    /// A model request failed and is tried again after `delay_ms`.
    #[serde(rename_all = "camelCase")]
    ModelRetrying {
        step: u32,
        attempt: u32,
        delay_ms: u64,
        reason: String,
    },
    #[serde(rename_all = "camelCase")]
    ModelResponded {
        step: u32,
        usage: Usage,
        tool_calls: usize,
        /// The reply as the model sent it (kept only in a durable tree, so the
        /// run can be resumed or replayed without the model).
        #[serde(skip_serializing_if = "Option::is_none")]
        reply: Option<Arc<Message>>,
    },
    #[serde(rename_all = "camelCase")]
    ToolCalled {
        step: u32,
        tool: String,
        tool_call_id: String,
        /// The error the model was shown, if the call failed.
        error: Option<String>,
    },
    /// The request builder dropped calls or results that would have broken pairing.
    #[serde(rename_all = "camelCase")]
    HistoryRepaired {
        unanswered_calls: Vec<String>,
        orphan_results: Vec<String>,
    },
    #[serde(rename_all = "camelCase")]
    ChildSpawned {
        child_run_id: String,
        agent_type: String,
        attempt: u32,
    },
    #[serde(rename_all = "camelCase")]
    ChildRetrying {
        failed_run_id: String,
        attempt: u32,
        delay_ms: u64,
        error: String,
    },
    #[serde(rename_all = "camelCase")]
    ChildFinished {
        child_run_id: String,
        status: AgentStatus,
    },
    OutputSet {
        output: Value,
    },
    /// The agent gave back its live slot while it waits for its children.
    Suspended,
    /// The agent holds a live slot again.
    Resumed,
    AgentFinished {
        state: Arc<AgentState>,
        /// Messages of the final history the run inherited (its output
        /// depends on it; the store keeps it with the final state).
        #[serde(skip)]
        inherited: usize,
    },
    AgentFailed {
        error: String,
        state: Arc<AgentState>,
        #[serde(skip)]
        inherited: usize,
    },
    AgentCancelled {
        state: Arc<AgentState>,
        #[serde(skip)]
        inherited: usize,
    },
    LimitHit {
        limit: LimitHit,
    },
}

impl EventKind {
    /// The final state, for the three events that end a run.
    pub fn final_state(&self) -> Option<&Arc<AgentState>> {
        match self {
            EventKind::AgentFinished { state, .. }
            | EventKind::AgentFailed { state, .. }
            | EventKind::AgentCancelled { state, .. } => Some(state),
            _ => None,
        }
    }

    /// How many messages of a final state's history were inherited.
    pub fn final_inherited(&self) -> Option<usize> {
        match self {
            EventKind::AgentFinished { inherited, .. }
            | EventKind::AgentFailed { inherited, .. }
            | EventKind::AgentCancelled { inherited, .. } => Some(*inherited),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            EventKind::AgentStarted { .. } => "agentStarted",
            EventKind::Checkpointed { .. } => "checkpointed",
            EventKind::StepStarted { .. } => "stepStarted",
            EventKind::ModelDelta { .. } => "modelDelta",
            EventKind::ModelRetrying { .. } => "modelRetrying",
            EventKind::ModelResponded { .. } => "modelResponded",
            EventKind::ToolCalled { .. } => "toolCalled",
            EventKind::HistoryRepaired { .. } => "historyRepaired",
            EventKind::ChildSpawned { .. } => "childSpawned",
            EventKind::ChildRetrying { .. } => "childRetrying",
            EventKind::ChildFinished { .. } => "childFinished",
            EventKind::OutputSet { .. } => "outputSet",
            EventKind::Suspended => "suspended",
            EventKind::Resumed => "resumed",
            EventKind::AgentFinished { .. } => "agentFinished",
            EventKind::AgentFailed { .. } => "agentFailed",
            EventKind::AgentCancelled { .. } => "agentCancelled",
            EventKind::LimitHit { .. } => "limitHit",
        }
    }
}

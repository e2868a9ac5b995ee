//! The closed set of things that happen in a tree. Events are the only way the
//! world learns what an agent did: the CLI, logs, stores and streams subscribe.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::checkpoint::Checkpoint;
use crate::id::{AgentId, RunId, TreeId};
use crate::limit::LimitHit;
use crate::message::Message;
use crate::model::{Delta, Usage};
use crate::state::{AgentState, AgentStatus};

/// One thing that happened in a tree, as subscribers receive it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Position in the tree's event sequence, from 1.
    pub seq: u64,
    /// The tree it happened in.
    pub tree_id: TreeId,
    /// The run the event is about.
    pub run_id: RunId,
    /// Wall-clock milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// What happened (serialised inline, tagged by `type`).
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What an [`Event`] says happened; the JSON's `type` tag is [`EventKind::name`].
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "camelCase")]
#[non_exhaustive]
pub enum EventKind {
    /// A run started (a root, a child, or a child's retry): its state is
    /// built and its actor exists, whether or not it has taken a turn yet.
    #[serde(rename_all = "camelCase")]
    AgentStarted {
        /// The agent's id (the same for every attempt of it).
        agent_id: AgentId,
        /// Its `agentType` (empty if it has none).
        agent_type: String,
        /// The parent's run id; `None` for the root.
        parent_run_id: Option<RunId>,
        /// 0 for the root, 1 for its children, and so on.
        depth: usize,
    },
    /// The run's state at a step boundary (only in a durable tree).
    Checkpointed {
        /// The state and counters a resumed run starts from.
        checkpoint: Arc<Checkpoint>,
    },
    /// A step began (its model call or handler batch follows).
    StepStarted {
        /// The step's number, from 1.
        step: u32,
    },
    /// A piece of the model's reply streamed in.
    ModelDelta {
        /// The step whose model call it belongs to.
        step: u32,
        /// The piece.
        delta: Delta,
    },
    /// A model request failed and is tried again after `delay_ms`.
    #[serde(rename_all = "camelCase")]
    ModelRetrying {
        /// The step whose model call failed.
        step: u32,
        /// The retry that comes next (1 for the first).
        attempt: u32,
        /// The wait before it, in milliseconds.
        delay_ms: u64,
        /// Why the attempt failed.
        reason: String,
    },
    /// The model replied to a step's request. Summed over a tree's events,
    /// `usage` is what the tree's calls were billed, each counted once.
    #[serde(rename_all = "camelCase")]
    ModelResponded {
        /// The step.
        step: u32,
        /// The tokens the call used; zero for a reply served from the record
        /// (`from_record`), which was counted when it was recorded.
        usage: Usage,
        /// How many tool calls the reply makes.
        tool_calls: usize,
        /// The reply as the model sent it (kept only in a durable tree, so the
        /// run can be resumed or replayed without the model).
        #[serde(skip_serializing_if = "Option::is_none")]
        reply: Option<Arc<Message>>,
        /// The reply was served from the store's record of an earlier call (a
        /// resumed or replayed tree), not by the model: no request was sent
        /// and nothing was billed again.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        from_record: bool,
        /// The reply was billed but not acted on (cut at the output limit):
        /// it is not in the history, and the run fails saying why.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        refused: bool,
    },
    /// A tool call ended and its result joined the history.
    #[serde(rename_all = "camelCase")]
    ToolCalled {
        /// The step that made the call.
        step: u32,
        /// The tool's name as the model called it.
        tool: String,
        /// The call's id.
        tool_call_id: String,
        /// The error the model was shown, if the call failed.
        error: Option<String>,
        /// The result, kept for a program's run in a durable tree: a
        /// resumed run of the program is given it instead of running the
        /// tool again (issue 37).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Arc<Message>>,
    },
    /// A program yielded (only in a durable tree): journaled, so a resumed
    /// run of it, which starts the program again, is held to what it did
    /// and draws again what it drew (issue 37).
    ProgramYielded {
        /// Its place among the run's yields, from 1.
        index: u32,
        /// The yield, in Codebuff's spelling (`"STEP"`, `{toolName, input}`, ...).
        yielded: Value,
        /// What the program drew on its way to it (clock readings, its
        /// random seed), if anything.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        drawn: Option<Value>,
    },
    /// The request builder dropped calls or results that would have broken pairing.
    #[serde(rename_all = "camelCase")]
    HistoryRepaired {
        /// Ids of tool calls dropped because no result answers them.
        unanswered_calls: Vec<String>,
        /// Ids of tool results dropped because no call asks for them.
        orphan_results: Vec<String>,
    },
    /// The run compacted its history before a step (`compact_at`, issue
    /// 37): old tool results cut to stubs, then, if still over, the turns
    /// before the kept ones replaced by a summary a model call wrote. A
    /// resumed or replayed run applies it again from this record.
    #[serde(rename_all = "camelCase")]
    HistoryCompacted {
        /// The step it was made before.
        step: u32,
        /// The context's size that set it off (tokens).
        tokens: u64,
        /// The tool results cut, oldest first.
        cut: Vec<crate::compact::CutResult>,
        /// The leading messages replaced by the summary (0: none).
        summarized: usize,
        /// The summary's text, when one was made.
        #[serde(skip_serializing_if = "Option::is_none")]
        summary: Option<Arc<str>>,
        /// What the summary call used; zero when none was made or it came
        /// from the record (`from_record`), which counted it.
        usage: Usage,
        /// Applied again from the journal's record (a resumed or replayed
        /// run): no model call was made.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        from_record: bool,
    },
    /// A child run was started (a first run or a retry).
    #[serde(rename_all = "camelCase")]
    ChildSpawned {
        /// The child's run id.
        child_run_id: RunId,
        /// The child's `agentType` (the matched `spawnableAgents` entry).
        agent_type: String,
        /// 0 for the first run, n for the n-th retry.
        attempt: u32,
    },
    /// A child failed and is run again after `delay_ms` (its failure policy retries).
    #[serde(rename_all = "camelCase")]
    ChildRetrying {
        /// The run id of the attempt that failed.
        failed_run_id: RunId,
        /// The attempt that comes next (1 for the first retry).
        attempt: u32,
        /// The backoff before it, in milliseconds.
        delay_ms: u64,
        /// Why the attempt failed.
        error: String,
    },
    /// A child run ended.
    #[serde(rename_all = "camelCase")]
    ChildFinished {
        /// The child's run id.
        child_run_id: RunId,
        /// How it ended.
        status: AgentStatus,
    },
    /// A background child's report joined the run's history (semantics
    /// §15): at the boundary before step `step + 1`.
    #[serde(rename_all = "camelCase")]
    BackgroundDelivered {
        /// The step the run had taken when the report joined its history.
        step: u32,
        /// The child's last run id.
        child_run_id: RunId,
    },
    /// The agent set its output (`set_output`).
    OutputSet {
        /// The value set.
        output: Value,
    },
    /// The agent gave back its live slot while it waits for its children.
    Suspended,
    /// The agent holds a live slot again.
    Resumed,
    /// The run ended normally.
    AgentFinished {
        /// Its final state.
        state: Arc<AgentState>,
        /// Messages of the final history the run inherited (its output
        /// depends on it; the store keeps it with the final state).
        #[serde(skip)]
        inherited: usize,
    },
    /// The run failed.
    AgentFailed {
        /// Why.
        error: String,
        /// Its final state.
        state: Arc<AgentState>,
        /// Messages of the final history the run inherited.
        #[serde(skip)]
        inherited: usize,
    },
    /// A tool call waits for a person's decision (semantics §12); the run
    /// holds its step's calls and gives its live slot back.
    #[serde(rename_all = "camelCase")]
    ApprovalRequested {
        /// The step of the call.
        step: u32,
        /// The model's call id (what a decision names).
        tool_call_id: String,
        /// The tool, by the name templates and policies use.
        tool: String,
        /// The input the model gave it.
        input: Value,
    },
    /// A person decided on a tool call (semantics §12).
    #[serde(rename_all = "camelCase")]
    ApprovalDecided {
        /// The step of the call.
        step: u32,
        /// The model's call id.
        tool_call_id: String,
        /// What they decided.
        decision: crate::approval::Decision,
    },
    /// A person allowed every call of a tool in the tree for good ("always
    /// allow", semantics §12): its later calls, in any agent at any depth and
    /// in later turns, run without asking. An event of the root run.
    ApprovalRuleAdded {
        /// The tool, by the name templates and policies use.
        tool: String,
    },
    /// The lifecycle hooks of a tool call decided (Claude Code's hooks):
    /// journaled, so a resumed or replayed run takes the verdict instead of
    /// running the hooks again.
    #[serde(rename_all = "camelCase")]
    HookDecided {
        /// The step of the call.
        step: u32,
        /// The model's call id.
        tool_call_id: String,
        /// Which hooks (`PreToolUse`, `PostToolUse`).
        hook: crate::lifecycle::HookEvent,
        /// What they decided together.
        verdict: crate::lifecycle::Verdict,
    },
    /// A run of an `isolation = "worktree"` template completed and its
    /// worktree was sealed: journaled, so a resumed or replayed run takes
    /// the report instead of touching the repository again.
    WorktreeSealed {
        /// The branch, its commits and changes.
        report: crate::worktree::WorktreeReport,
    },
    /// A person sent the run a steering message (semantics §9); it joins the
    /// history at the next step boundary.
    Steered {
        /// The step the run was on when it arrived.
        step: u32,
        /// What they said.
        text: Arc<str>,
    },
    /// The run was cancelled.
    AgentCancelled {
        /// Its final state.
        state: Arc<AgentState>,
        /// Messages of the final history the run inherited.
        #[serde(skip)]
        inherited: usize,
    },
    /// A tree-wide limit stopped the run.
    LimitHit {
        /// Which limit, and how.
        limit: LimitHit,
    },
    /// A budget of the tree is spent and the tree pauses instead of failing
    /// (`on_budget = "pause"`, semantics §13): the run waits, holding no live
    /// slot, until the budget is raised.
    BudgetReached {
        /// Which budget, and how.
        limit: LimitHit,
    },
    /// The tree's budgets were raised (semantics §13); paused runs go on.
    #[serde(rename_all = "camelCase")]
    LimitsRaised {
        /// The tree's model steps now allowed, if raised.
        #[serde(skip_serializing_if = "Option::is_none")]
        max_steps: Option<u64>,
        /// Its tokens now allowed, if raised.
        #[serde(skip_serializing_if = "Option::is_none")]
        max_tokens: Option<u64>,
        /// Its credits now allowed, if raised.
        #[serde(skip_serializing_if = "Option::is_none")]
        max_credits: Option<f64>,
    },
    /// The run called the same tool with the same input and got the same
    /// result `repeats` times in a row (its template's `loop_detection`).
    Looping {
        /// The step of the latest of those calls.
        step: u32,
        /// The tool's name as the model called it.
        tool: String,
        /// Identical calls in a row so far.
        repeats: u32,
        /// Whether the run fails for it (`fail_after`), or is only warned
        /// about (`warn_after`).
        fatal: bool,
    },
    /// The run's own work in flight (its model call or tools) made no
    /// progress for its template's `idle_timeout`; the run fails next.
    #[serde(rename_all = "camelCase")]
    Stalled {
        /// The step the run was on.
        step: u32,
        /// How long it went without progress, in milliseconds.
        idle_ms: u64,
    },
    /// A follow-up turn was queued behind the tree's running turn
    /// (semantics §14): an event of the run its root will be (`T/0~turn`),
    /// which starts when the turns before it have ended.
    #[serde(rename_all = "camelCase")]
    TurnQueued {
        /// Its turn number.
        turn: u32,
        /// Its place in the tree's queue when it was queued: 1 is next.
        position: usize,
        /// Its prompt.
        prompt: Arc<str>,
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

    /// The wire name of the kind (the `type` tag of its JSON): its journal
    /// type's name ([`EventType::name`], the one list of the names), or
    /// for the two kinds the journal leaves out, theirs.
    pub fn name(&self) -> &'static str {
        match journal_type(self) {
            Ok(t) => t.name(),
            Err(name) => name,
        }
    }
}

/// The journal type of a kind, or the wire name of a kind the journal
/// leaves out (streaming deltas and checkpoints). Exhaustive: a new
/// `EventKind` must say here whether it is journaled, and as what.
fn journal_type(kind: &EventKind) -> Result<EventType, &'static str> {
    Ok(match kind {
        EventKind::ModelDelta { .. } => return Err("modelDelta"),
        EventKind::Checkpointed { .. } => return Err("checkpointed"),
        EventKind::AgentStarted { .. } => EventType::AgentStarted,
        EventKind::StepStarted { .. } => EventType::StepStarted,
        EventKind::ModelRetrying { .. } => EventType::ModelRetrying,
        EventKind::ModelResponded { .. } => EventType::ModelResponded,
        EventKind::ToolCalled { .. } => EventType::ToolCalled,
        EventKind::ProgramYielded { .. } => EventType::ProgramYielded,
        EventKind::HistoryRepaired { .. } => EventType::HistoryRepaired,
        EventKind::HistoryCompacted { .. } => EventType::HistoryCompacted,
        EventKind::ChildSpawned { .. } => EventType::ChildSpawned,
        EventKind::ChildRetrying { .. } => EventType::ChildRetrying,
        EventKind::ChildFinished { .. } => EventType::ChildFinished,
        EventKind::BackgroundDelivered { .. } => EventType::BackgroundDelivered,
        EventKind::OutputSet { .. } => EventType::OutputSet,
        EventKind::Suspended => EventType::Suspended,
        EventKind::Resumed => EventType::Resumed,
        EventKind::AgentFinished { .. } => EventType::AgentFinished,
        EventKind::AgentFailed { .. } => EventType::AgentFailed,
        EventKind::AgentCancelled { .. } => EventType::AgentCancelled,
        EventKind::LimitHit { .. } => EventType::LimitHit,
        EventKind::Steered { .. } => EventType::Steered,
        EventKind::BudgetReached { .. } => EventType::BudgetReached,
        EventKind::LimitsRaised { .. } => EventType::LimitsRaised,
        EventKind::ApprovalRequested { .. } => EventType::ApprovalRequested,
        EventKind::ApprovalDecided { .. } => EventType::ApprovalDecided,
        EventKind::ApprovalRuleAdded { .. } => EventType::ApprovalRuleAdded,
        EventKind::HookDecided { .. } => EventType::HookDecided,
        EventKind::WorktreeSealed { .. } => EventType::WorktreeSealed,
        EventKind::Looping { .. } => EventType::Looping,
        EventKind::Stalled { .. } => EventType::Stalled,
        EventKind::TurnQueued { .. } => EventType::TurnQueued,
    })
}

/// The type of a journal entry (a store's record of an [`Event`]): its
/// `type` on the wire (and an event stream's event name). Every `EventKind`
/// but the two the journal leaves out (`modelDelta`, `checkpointed`); each
/// variant is the `EventKind` of its name ([`EventType::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventType {
    /// `agentStarted`: a run started.
    AgentStarted,
    /// `stepStarted`: a run began a step.
    StepStarted,
    /// `modelRetrying`: a model request failed and is tried again.
    ModelRetrying,
    /// `modelResponded`: the model answered a step (with its usage).
    ModelResponded,
    /// `toolCalled`: a tool call of a step ended (with the error the model
    /// was shown, if it failed).
    ToolCalled,
    /// `programYielded`: a program yielded (in a durable tree).
    ProgramYielded,
    /// `historyRepaired`: the request builder dropped calls or results that
    /// would have broken pairing.
    HistoryRepaired,
    /// `historyCompacted`: a run cut old tool results and summarised old
    /// turns before a step (`compact_at`).
    HistoryCompacted,
    /// `childSpawned`: a run spawned a child (or an attempt of one).
    ChildSpawned,
    /// `childRetrying`: a failed child is tried again after a delay.
    ChildRetrying,
    /// `childFinished`: a child ended, with its status.
    ChildFinished,
    /// `backgroundDelivered`: a background child's report joined its parent's history.
    BackgroundDelivered,
    /// `outputSet`: a run set its output value.
    OutputSet,
    /// `suspended`: a run gave back its live slot to wait for its children.
    Suspended,
    /// `resumed`: a run holds a live slot again.
    Resumed,
    /// `agentFinished`: a run completed.
    AgentFinished,
    /// `agentFailed`: a run failed.
    AgentFailed,
    /// `agentCancelled`: a run was cancelled.
    AgentCancelled,
    /// `limitHit`: a limit of the tree was reached.
    LimitHit,
    /// `steered`: a person sent a running agent a message.
    Steered,
    /// `budgetReached`: a budget is spent and the run waits for more.
    BudgetReached,
    /// `limitsRaised`: the tree's budgets were raised.
    LimitsRaised,
    /// `approvalRequested`: a tool call waits for a person's decision.
    ApprovalRequested,
    /// `approvalDecided`: a person decided on a tool call.
    ApprovalDecided,
    /// `approvalRuleAdded`: a person allowed every call of a tool in the tree.
    ApprovalRuleAdded,
    /// `hookDecided`: the lifecycle hooks of a tool call decided.
    HookDecided,
    /// `worktreeSealed`: a run's worktree was sealed.
    WorktreeSealed,
    /// `looping`: a run repeated the same tool call with the same result.
    Looping,
    /// `stalled`: a run's own work in flight made no progress for its `idle_timeout`.
    Stalled,
    /// `turnQueued`: a follow-up turn waits for the tree's running turn to end.
    TurnQueued,
}

impl EventType {
    /// Every journal type.
    pub const ALL: [EventType; 30] = [
        EventType::AgentStarted,
        EventType::StepStarted,
        EventType::ModelRetrying,
        EventType::ModelResponded,
        EventType::ToolCalled,
        EventType::ProgramYielded,
        EventType::HistoryRepaired,
        EventType::HistoryCompacted,
        EventType::ChildSpawned,
        EventType::ChildRetrying,
        EventType::ChildFinished,
        EventType::BackgroundDelivered,
        EventType::OutputSet,
        EventType::Suspended,
        EventType::Resumed,
        EventType::AgentFinished,
        EventType::AgentFailed,
        EventType::AgentCancelled,
        EventType::LimitHit,
        EventType::Steered,
        EventType::Looping,
        EventType::ApprovalRequested,
        EventType::ApprovalDecided,
        EventType::ApprovalRuleAdded,
        EventType::HookDecided,
        EventType::WorktreeSealed,
        EventType::BudgetReached,
        EventType::LimitsRaised,
        EventType::Stalled,
        EventType::TurnQueued,
    ];

    /// The journal type of an event; `None` for what the journal leaves out
    /// (streaming deltas and checkpoints).
    pub fn of(kind: &EventKind) -> Option<EventType> {
        journal_type(kind).ok()
    }

    /// Its name on the wire: the one list of the event kinds' names
    /// (`EventKind::name` and its JSON's `type`, this type's JSON, the
    /// journal's `type`, a stream's event name).
    pub fn name(self) -> &'static str {
        match self {
            EventType::AgentStarted => "agentStarted",
            EventType::StepStarted => "stepStarted",
            EventType::ModelRetrying => "modelRetrying",
            EventType::ModelResponded => "modelResponded",
            EventType::ToolCalled => "toolCalled",
            EventType::ProgramYielded => "programYielded",
            EventType::HistoryRepaired => "historyRepaired",
            EventType::HistoryCompacted => "historyCompacted",
            EventType::ChildSpawned => "childSpawned",
            EventType::ChildRetrying => "childRetrying",
            EventType::ChildFinished => "childFinished",
            EventType::BackgroundDelivered => "backgroundDelivered",
            EventType::OutputSet => "outputSet",
            EventType::Suspended => "suspended",
            EventType::Resumed => "resumed",
            EventType::AgentFinished => "agentFinished",
            EventType::AgentFailed => "agentFailed",
            EventType::AgentCancelled => "agentCancelled",
            EventType::LimitHit => "limitHit",
            EventType::Steered => "steered",
            EventType::BudgetReached => "budgetReached",
            EventType::LimitsRaised => "limitsRaised",
            EventType::ApprovalRequested => "approvalRequested",
            EventType::ApprovalDecided => "approvalDecided",
            EventType::ApprovalRuleAdded => "approvalRuleAdded",
            EventType::HookDecided => "hookDecided",
            EventType::WorktreeSealed => "worktreeSealed",
            EventType::Looping => "looping",
            EventType::Stalled => "stalled",
            EventType::TurnQueued => "turnQueued",
        }
    }

    /// Whether it ends a run (`agentFinished`, `agentFailed`,
    /// `agentCancelled`): its entry carries the run's output.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            EventType::AgentFinished | EventType::AgentFailed | EventType::AgentCancelled
        )
    }
}

impl Serialize for EventType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no journal type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownEventType(pub String);

impl fmt::Display for UnknownEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown event type {:?}", self.0)
    }
}

impl std::error::Error for UnknownEventType {}

impl FromStr for EventType {
    type Err = UnknownEventType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventType::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| UnknownEventType(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeSet;
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::{EventKind, EventType};
    use crate::approval::Decision;
    use crate::checkpoint::Checkpoint;
    use crate::limit::{Limit, LimitHit};
    use crate::model::{Delta, Usage};
    use crate::state::{AgentState, AgentStatus};

    /// One event of every kind.
    fn every_kind() -> Vec<EventKind> {
        let state = Arc::new(AgentState::of_run("t/0".parse().unwrap()));
        let limit = || LimitHit::new(Limit::Deadline, "late");
        vec![
            EventKind::AgentStarted {
                agent_id: "t/0".parse().unwrap(),
                agent_type: "a".into(),
                parent_run_id: None,
                depth: 0,
            },
            EventKind::Checkpointed {
                checkpoint: Arc::new(Checkpoint {
                    step: 0,
                    children_spawned: 0,
                    inherited: 0,
                    state: AgentState::of_run("t/0".parse().unwrap()),
                }),
            },
            EventKind::StepStarted { step: 1 },
            EventKind::ModelDelta {
                step: 1,
                delta: Delta::Text { text: "x".into() },
            },
            EventKind::ModelRetrying {
                step: 1,
                attempt: 1,
                delay_ms: 1,
                reason: "r".into(),
            },
            EventKind::ModelResponded {
                step: 1,
                usage: Usage::default(),
                tool_calls: 0,
                reply: None,
                from_record: false,
                refused: false,
            },
            EventKind::ToolCalled {
                step: 1,
                tool: "t".into(),
                tool_call_id: "c".into(),
                error: None,
                result: None,
            },
            EventKind::ProgramYielded {
                index: 1,
                yielded: json!("STEP"),
                drawn: None,
            },
            EventKind::HistoryRepaired {
                unanswered_calls: vec![],
                orphan_results: vec![],
            },
            EventKind::HistoryCompacted {
                step: 2,
                tokens: 900,
                cut: vec![],
                summarized: 3,
                summary: Some("s".into()),
                usage: Usage::default(),
                from_record: false,
            },
            EventKind::ChildSpawned {
                child_run_id: "t/0.1".parse().unwrap(),
                agent_type: "a".into(),
                attempt: 1,
            },
            EventKind::ChildRetrying {
                failed_run_id: "t/0.1".parse().unwrap(),
                attempt: 2,
                delay_ms: 1,
                error: "e".into(),
            },
            EventKind::ChildFinished {
                child_run_id: "t/0.1".parse().unwrap(),
                status: AgentStatus::Completed,
            },
            EventKind::BackgroundDelivered {
                step: 1,
                child_run_id: "t/0.1".parse().unwrap(),
            },
            EventKind::OutputSet { output: json!(1) },
            EventKind::Suspended,
            EventKind::Resumed,
            EventKind::AgentFinished {
                state: state.clone(),
                inherited: 0,
            },
            EventKind::AgentFailed {
                error: "e".into(),
                state: state.clone(),
                inherited: 0,
            },
            EventKind::ApprovalRequested {
                step: 1,
                tool_call_id: "c".into(),
                tool: "t".into(),
                input: json!({}),
            },
            EventKind::ApprovalDecided {
                step: 1,
                tool_call_id: "c".into(),
                decision: Decision::Approve { input: None },
            },
            EventKind::ApprovalRuleAdded { tool: "t".into() },
            EventKind::HookDecided {
                step: 1,
                tool_call_id: "c".into(),
                hook: crate::lifecycle::HookEvent::PreToolUse,
                verdict: crate::lifecycle::Verdict::default(),
            },
            EventKind::WorktreeSealed {
                report: crate::worktree::WorktreeReport::default(),
            },
            EventKind::Steered {
                step: 1,
                text: Arc::from("s"),
            },
            EventKind::AgentCancelled {
                state,
                inherited: 0,
            },
            EventKind::LimitHit { limit: limit() },
            EventKind::BudgetReached { limit: limit() },
            EventKind::LimitsRaised {
                max_steps: Some(1),
                max_tokens: None,
                max_credits: None,
            },
            EventKind::Looping {
                step: 1,
                tool: "t".into(),
                repeats: 3,
                fatal: false,
            },
            EventKind::Stalled {
                step: 1,
                idle_ms: 1,
            },
            EventKind::TurnQueued {
                turn: 1,
                position: 1,
                prompt: Arc::from("p"),
            },
        ]
    }

    /// Every kind's name is its JSON's `type`, and its journal type's name
    /// reads back as that type; every journal type is some kind's.
    #[test]
    fn every_event_kinds_name_round_trips() {
        let kinds = every_kind();
        let mut journaled = BTreeSet::new();
        for kind in &kinds {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json["type"], Value::from(kind.name()), "{kind:?}");
            match EventType::of(kind) {
                Some(t) => {
                    assert_eq!(t.name(), kind.name());
                    assert_eq!(kind.name().parse::<EventType>(), Ok(t));
                    assert_eq!(serde_json::to_value(t).unwrap(), json["type"]);
                    assert!(journaled.insert(t.name()), "{} twice", t.name());
                }
                None => {
                    assert!(["modelDelta", "checkpointed"].contains(&kind.name()));
                    assert!(kind.name().parse::<EventType>().is_err());
                }
            }
        }
        let all: BTreeSet<&str> = EventType::ALL.iter().map(|t| t.name()).collect();
        assert_eq!(all.len(), EventType::ALL.len(), "a name listed twice");
        assert_eq!(journaled, all, "a journal type without a kind here");
    }
}

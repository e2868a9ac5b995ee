//! The agent actor's messages and what it starts with: its inbox's one
//! type, kept apart from the handler that reads it.

use std::sync::Arc;

use ractor::{ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use crate::approval::{DecideRefused, Decision};
use crate::failure::Failure;
use crate::hooks::{Slot, TreeHooks};
use crate::id::RunId;
use crate::model::{ModelRequest, ModelResponse, Usage};
use crate::state::AgentState;
use crate::steer::SteerRefused;
use crate::step::StepMachine;
use crate::tool::ToolOutput;

use super::{CancelReason, ChildKey, RunResult};

/// Where a run's result goes.
pub enum Reply {
    /// A parent actor: it takes the result from the supervision event.
    Parent(ChildKey),
    /// The supervisor of a root run.
    Root(oneshot::Sender<RunResult>),
}

/// What `Status` answers.
#[derive(Clone, Debug)]
pub struct AgentSnapshot {
    /// The run's state as it stands (mid-step included).
    pub state: AgentState,
    /// The step the run is in (0 before its first).
    pub step: u32,
    /// Its children whose actors are running now.
    pub live_children: usize,
}

/// The messages of an agent actor. The supervisor sends `Cancel`,
/// `CancelChild` and `Status`; the others are the actor's own work coming
/// back (from its tasks, timers and children).
pub enum AgentMsg {
    /// The model call of `step` ended.
    /// Boxed: the mailbox allocates blocks of messages, so every variant's size
    /// is paid per slot by every agent.
    ModelDone {
        /// The step that made the call; a reply for an other step is ignored.
        step: u32,
        /// The reply, or why the call failed and what a reply that came
        /// and is not acted on was billed.
        result: Box<Result<ModelResponse, (Failure, Option<Usage>)>>,
    },
    /// A tool call of `step` ended.
    ToolDone {
        /// The step that made the call.
        step: u32,
        /// The call's index among the step's tool calls.
        index: usize,
        /// What the tool returned (or that it panicked). Boxed, like the
        /// other large variants: every message is boxed at this enum's size.
        outcome: Box<ToolOutcome>,
        /// What its `PostToolUse` hooks decided, if it has any (their note
        /// is in the outcome already; this is for the journal).
        post: Option<Box<crate::lifecycle::Verdict>>,
    },
    /// The stop hooks of `step` decided.
    StopHooksDone {
        /// The step that would have ended the turn.
        step: u32,
        /// What they decided.
        verdict: Box<crate::lifecycle::Verdict>,
    },
    /// The run's worktree was sealed (`None`: there was none to seal).
    WorktreeSealed(Option<Box<crate::worktree::WorktreeReport>>),
    /// The start hooks (`UserPromptSubmit`, `SubagentStart`) decided.
    StartHooksDone(Box<crate::lifecycle::Verdict>),
    /// The `PreToolUse` hooks of `step`'s calls decided.
    HooksDone {
        /// The step of the calls.
        step: u32,
        /// Each call's verdict, by its index among the step's tool calls.
        verdicts: Box<Vec<(usize, crate::lifecycle::Verdict)>>,
    },
    /// A child's actor started.
    ChildStarted {
        /// Which child.
        key: ChildKey,
        /// Its actor.
        actor: ActorRef<AgentMsg>,
    },
    /// A child's actor could not be started.
    ChildNotStarted {
        /// Which child.
        key: ChildKey,
        /// Why.
        error: String,
    },
    /// A child of a resumed tree that had finished before (it is not run again).
    ChildRecovered {
        /// Which child.
        key: ChildKey,
        /// Its recorded result.
        result: Box<RunResult>,
    },
    /// The backoff before a child's retry is over.
    RetryDue {
        /// The child to run again.
        key: ChildKey,
    },
    /// The live slot the agent waited for (`None`: live agents are not limited).
    SlotReady(Option<Slot>),
    /// The store takes writes again (see `TreeHooks::store_ready`): the
    /// model request that waited for it goes now.
    StoreReady(Box<ModelRequest>),
    /// The step timeout of `step` fired.
    StepTimeout {
        /// The step it was started for.
        step: u32,
        /// Which timer sent it; a stale one (from a timer already stopped) is ignored.
        generation: u64,
    },
    /// The approval timer of `step` fired (`approval_timeout`): the calls
    /// still waiting get the template's `approval_default`.
    ApprovalTimeout {
        /// The step whose calls it was started for.
        step: u32,
        /// Which timer sent it; a stale one is ignored.
        generation: u64,
    },
    /// The idle watchdog's timer fired (`idle_timeout`).
    IdleCheck {
        /// Which timer sent it; a stale one is ignored.
        generation: u64,
    },
    /// Stop the run early, for this reason (its children are cancelled too).
    Cancel(CancelReason),
    /// Cancel this child of ours that has not started (it waits for a live
    /// slot or a retry); a child that runs is cancelled directly.
    CancelChild {
        /// The child's run id.
        run_id: RunId,
    },
    /// Answer with a snapshot of the run.
    Status(RpcReplyPort<AgentSnapshot>),
    /// A steering message for this run (semantics §9): accepted (it joins the
    /// history at the next step boundary) or refused, answered at once.
    Steer {
        /// What the person said.
        text: Arc<str>,
        /// How much steering the run may hold pending, this one included.
        limits: crate::steer::SteerLimits,
        /// Where the answer goes.
        reply: RpcReplyPort<Result<(), SteerRefused>>,
    },
    /// The tree's budgets were raised: a run paused on its budget asks for
    /// a live slot and tries its step again.
    BudgetRaised,
    /// A person's decision on a tool call that waits for approval
    /// (semantics §12), answered at once.
    Decide {
        /// The model's call id.
        call_id: String,
        /// What they decided (boxed: it is the enum's largest field).
        decision: Box<Decision>,
        /// Where the answer goes.
        reply: RpcReplyPort<Result<(), DecideRefused>>,
    },
}

/// How a tool call's task ended.
pub enum ToolOutcome {
    /// The tool returned: its output, or its error (what the model reads).
    Done(Result<ToolOutput, crate::tool::ToolError>),
    /// The tool panicked, with this message.
    Panicked(String),
}

/// What an agent actor starts with.
pub struct AgentArgs {
    /// The agent's tree.
    pub hooks: Arc<dyn TreeHooks>,
    /// Boxed: it moves through spawning several times.
    pub machine: Box<StepMachine>,
    /// Where its result goes.
    pub reply: Reply,
    /// The live slot the agent runs in (acquired before it was started).
    pub slot: Option<Slot>,
    /// Where it works: its parent's workspace (the tree's, for a root), or
    /// one of its own when its template isolates it.
    pub workspace: Option<Arc<dyn crate::tool::Workspace>>,
    /// The span the agent's `invoke_agent` span is a child of: its parent
    /// agent's, or for a root the tree's (so a whole tree is one trace).
    pub parent_span: tracing::Span,
}

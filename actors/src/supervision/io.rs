//! What the child table takes and answers: its inputs (a spawn call opened,
//! what happened to a child), the launches and outputs it decides, and the
//! values they carry.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::event::EventKind;
use crate::failure::Failure;
use crate::hooks::{RunIds, SlotPriority};
use crate::id::{AgentId, RunId};
use crate::limit::LimitHit;
use crate::spawn::{ChildPlan, ChildReport, ParentInfo, SpawnPlan};
use crate::state::AgentState;
use crate::toolbox::Toolbox;

/// Identifies one attempt of one child of one spawn call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChildKey {
    /// The parent's step that spawned it.
    pub step: u32,
    /// The index of the spawn call among the step's tool calls.
    pub call: usize,
    /// The child's place in the call's request.
    pub child: usize,
    /// 0 for the first run, n for the n-th retry.
    pub attempt: u32,
}

/// The final result of a run, as its parent or the supervisor receives it.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The run's final state.
    pub state: Arc<AgentState>,
    /// The output value of semantics §7.
    pub value: Value,
}

/// Why an agent is asked to stop early.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CancelReason {
    /// A user (or the service) cancelled this agent or an ancestor.
    Requested,
    /// A tree-wide limit ran out: the agent fails, naming it.
    Limit(LimitHit),
    /// The parent is ending (it failed); the child is cancelled.
    ParentEnded,
    /// Something the tree depends on broke (e.g. its store): the agent fails with this.
    Failed(Failure),
}

/// One requested child of a spawn call, as the tree admitted it.
// Short-lived (built and taken apart by one spawn call), so not boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Admission {
    /// Not permitted, over a limit, or without a toolbox: reported as is.
    Refused {
        /// The agent type as requested.
        agent_type: String,
        /// Why it was refused (what its entry's `errorMessage` says).
        error: String,
    },
    /// Admitted: it starts when it gets a live slot.
    Admitted {
        /// What it runs.
        plan: ChildPlan,
        /// Its template's toolbox.
        toolbox: Arc<Toolbox>,
        /// The agent id every attempt shares (the first attempt's run id;
        /// attempt `n` runs as `id.retry(n)`).
        id: RunId,
    },
    /// Admitted, to be planned from its call's [`Planner`] when it comes
    /// up: until then it is these two numbers (issue 34).
    Waiting {
        /// Its kind in the call's plan.
        kind: u16,
        /// The ordinal its agent id extends its parent's run id with
        /// (`P.ordinal`).
        ordinal: u32,
    },
}

/// What the waiting children of a planned call are made from when they
/// come up.
#[derive(Debug)]
pub struct Planner {
    /// The call's plan: its entries and kinds.
    pub plan: Arc<SpawnPlan>,
    /// Each kind's toolbox (`None` where it could not be made: the
    /// children of that kind were refused).
    pub toolboxes: Vec<Option<Arc<Toolbox>>>,
}

/// What happened to the parent's children.
#[derive(Debug)]
pub enum Input<A> {
    /// A spawn call (`inline` for `spawn_agent_inline`) of step `step`, call
    /// `call`: its children in request order.
    #[allow(missing_docs)]
    Open {
        step: u32,
        call: usize,
        inline: bool,
        /// A `spawn_agents_async` call (semantics §15): the parent does not
        /// wait, and each child's report is handed over on its own.
        background: bool,
        /// What the children take from the parent, as of the spawn.
        parent: Arc<ParentInfo>,
        children: Vec<Admission>,
        /// What its [`Admission::Waiting`] children are planned from.
        planner: Option<Planner>,
    },
    /// A child's actor is running.
    #[allow(missing_docs)]
    Started { key: ChildKey, actor: A },
    /// A child's actor ended with its result.
    #[allow(missing_docs)]
    Ended {
        key: ChildKey,
        actor: A,
        result: RunResult,
    },
    /// A child could not be started (or was cancelled before it started).
    #[allow(missing_docs)]
    NotStarted { key: ChildKey, error: String },
    /// A child of a resumed tree had finished before: its stored result.
    #[allow(missing_docs)]
    Recovered { key: ChildKey, result: RunResult },
    /// A child's actor died without a result (a panic, a kill).
    #[allow(missing_docs)]
    Lost { actor: A, error: String },
    /// The retry timer of `key` (the next attempt) fired.
    #[allow(missing_docs)]
    RetryDue { key: ChildKey },
    /// Cancel the child whose attempt under way is `run_id`.
    #[allow(missing_docs)]
    Cancel { run_id: RunId },
    /// The parent's run is over (finished, failed, or cancelled for
    /// `cancelled`): its children are told to stop.
    #[allow(missing_docs)]
    ParentEnded { cancelled: Option<CancelReason> },
}

/// Children to start, in order, one after the other as live slots free up.
#[derive(Debug)]
pub struct Launch {
    /// What the children take from their parent.
    pub parent: Arc<ParentInfo>,
    /// How they wait for a live slot.
    pub priority: SlotPriority,
    /// The attempts to start, in request order.
    pub children: Vec<Start>,
    /// Set when more of the call's children follow (in [`Output::More`]):
    /// the launch waits in line for all of them at once, and for more
    /// starts once these are taken.
    pub stream: Option<Stream>,
}

/// A launch that more children of its call follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream {
    /// The call (step, index) whose children follow.
    pub call: (u32, usize),
    /// How many children the launch starts in all: its place in the line
    /// for live slots is for that many.
    pub line: usize,
}

/// One attempt of a child to start. A launch holds its call's children
/// until each gets a live slot (~10^7 at once in the 10^8-agent tree), so
/// this is small: the plan is the slot's, shared, and the ids are made
/// when the child starts ([`Start::ids`]).
#[derive(Debug)]
pub struct Start {
    /// The child and attempt (its reply goes back under this key).
    pub key: ChildKey,
    /// What it runs (the slot's own plan, shared, not copied).
    pub plan: Arc<ChildPlan>,
    /// Its template's toolbox.
    pub toolbox: Arc<Toolbox>,
    /// Its agent id, as the slot keeps it.
    pub(super) id: ChildId,
}

impl Start {
    /// Its agent id and this attempt's run id, `parent_run` being its
    /// launch's parent's run id ([`ParentInfo::run_id`]).
    pub fn ids(&self, parent_run: &RunId) -> RunIds {
        self.id.ids(parent_run, self.key.attempt)
    }
}

/// Every report of one spawn call, in request order.
#[derive(Debug)]
pub struct Delivery {
    /// The step of the spawn call.
    pub step: u32,
    /// The spawn call's index in its step.
    pub call: usize,
    /// A `spawn_agent_inline` call (one report, with its history).
    pub inline: bool,
    /// One per requested child, in request order.
    pub reports: Vec<ChildReport>,
}

/// What the driver must do, in order.
#[derive(Debug)]
pub enum Output<A> {
    /// An event of the parent's run (`childSpawned`, `childFinished`, `childRetrying`).
    Emit(EventKind),
    /// Children are out: the parent waits for them (it gives its live slot
    /// back, unless its step's tools still run).
    Wait,
    /// Start these children, each when it gets a live slot.
    Launch(Launch),
    /// More children for the launch of `call` (its [`Stream`]); `last`: no
    /// more follow.
    #[allow(missing_docs)]
    More {
        call: (u32, usize),
        children: Vec<Start>,
        last: bool,
    },
    /// A child waiting for its slot was cancelled: it must not start.
    #[allow(missing_docs)]
    Skip { run_id: RunId },
    /// Tell this running child to stop.
    #[allow(missing_docs)]
    Cancel { actor: A, reason: CancelReason },
    /// Feed `RetryDue { key }` after `delay`.
    #[allow(missing_docs)]
    Retry { key: ChildKey, delay: Duration },
    /// The retry timer of `key` is no longer wanted.
    #[allow(missing_docs)]
    StopRetry { key: ChildKey },
    /// Hand the call's reports to the step machine (`spawn_done` / `inline_done`).
    Deliver(Delivery),
    /// Hand one background child's final report to the step machine
    /// (`background_reported`).
    Report(Box<ChildReport>),
    /// A child with the `escalate` policy failed: the parent fails with this.
    #[allow(missing_docs)]
    Fail { failure: Failure },
}

/// A child's agent id as its slot keeps it: the ordinal that extends its
/// parent's run id (`P.n`: every child the parent admits), or, for one
/// started again under a stored id of another shape, that id. An ordinal
/// is 4 bytes where a [`RunId`] is ~70 with its path.
#[derive(Clone, Debug)]
pub(super) enum ChildId {
    Of(u32),
    Given(Box<RunId>),
}

impl ChildId {
    pub(super) fn new(id: RunId, parent: &RunId) -> Self {
        match id.path().last().map(|s| s.ordinal) {
            Some(n) if parent.child(n) == id => ChildId::Of(n),
            _ => ChildId::Given(Box::new(id)),
        }
    }

    pub(super) fn resolve(&self, parent: &RunId) -> RunId {
        match self {
            ChildId::Of(n) => parent.child(*n),
            ChildId::Given(id) => (**id).clone(),
        }
    }

    /// The agent id and the run id of attempt `attempt`.
    pub(super) fn ids(&self, parent: &RunId, attempt: u32) -> RunIds {
        let id = self.resolve(parent);
        RunIds {
            run_id: id.retry(attempt),
            agent_id: AgentId::from_run(id),
        }
    }
}

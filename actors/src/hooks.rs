//! The port through which an agent reaches what is tree-wide: templates, models,
//! tools, ids, limits, live slots and events. The supervisor implements it; the
//! agent never sees the implementation, and nothing here does I/O on the hot path.

use std::sync::Arc;

use futures::future::BoxFuture;
use ractor::ActorCell;

use crate::checkpoint::Recovered;
use crate::event::EventKind;
use crate::limit::LimitHit;
use crate::model::{Model, Usage};
use crate::template::AgentTemplate;
use crate::toolbox::{Toolbox, ToolboxError};

/// A live-agent slot; dropping it gives the slot back.
pub struct Slot(Box<dyn std::any::Any + Send>);

impl Slot {
    /// A slot holding `held` (the supervisor's permit); dropping the slot drops it.
    pub fn new(held: impl std::any::Any + Send) -> Self {
        Slot(Box::new(held))
    }

    /// What the supervisor put in (so it can take a slot back without releasing it).
    pub fn into_inner(self) -> Box<dyn std::any::Any + Send> {
        self.0
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

/// The live slots of one launch's children, handed out one after the other.
/// A launch waits in line once for all its children ([`SlotLine::Line`]): a
/// child waiting for its slot costs the launch nothing of its own (a wait per
/// child, a channel, a boxed future and a heap entry, was ~160 bytes, and a
/// tree at its live cap holds `cap × fanout` children waiting: 10^7 in the
/// 10^8-agent tree at 1,000 live).
pub enum SlotLine {
    /// Live agents are not limited: every child starts without a slot.
    Unlimited,
    /// The slots of the launch's children, in turn, as they are handed out.
    Line(tokio::sync::mpsc::UnboundedReceiver<Slot>),
    /// One wait per child (a port that cannot queue a launch as one).
    Each(std::collections::VecDeque<BoxFuture<'static, Option<Slot>>>),
}

impl SlotLine {
    /// The next child's slot (`None` when live agents are not limited).
    /// Cancel-safe: a wait cut short keeps its place in line for the next
    /// call.
    pub async fn next(&mut self) -> Option<Slot> {
        match self {
            SlotLine::Unlimited => None,
            SlotLine::Line(slots) => slots.recv().await,
            SlotLine::Each(waits) => {
                let slot = match waits.front_mut() {
                    Some(wait) => wait.await,
                    None => return None,
                };
                waits.pop_front();
                slot
            }
        }
    }
}

impl std::fmt::Debug for SlotLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SlotLine::Unlimited => "SlotLine::Unlimited",
            SlotLine::Line(_) => "SlotLine::Line",
            SlotLine::Each(_) => "SlotLine::Each",
        })
    }
}

/// Who waits for a slot: a parent taking its slot back to finish, or a new
/// agent at `depth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotPriority {
    /// The depth of the agent that waits (0 for the root).
    pub depth: usize,
    /// Whether it is a parent taking its slot back to finish (served first).
    pub resume: bool,
}

pub use crate::id::RunIds;
use crate::id::{RunId, TreeId};

/// What an agent may ask of its tree; the supervisor implements it, once per tree.
pub trait TreeHooks: Send + Sync + 'static {
    /// The tree's id.
    fn tree_id(&self) -> &TreeId;

    /// The template with exactly this id.
    fn template(&self, id: &str) -> Option<Arc<AgentTemplate>>;

    /// Whether any template answers to `requested` (for "not found" vs "not allowed").
    fn knows_agent(&self, requested: &str) -> bool;

    /// The model configured under `name`.
    fn model(&self, name: &str) -> Option<Arc<dyn Model>>;

    /// The toolbox of a template (built once and cached).
    fn toolbox(&self, template: &AgentTemplate) -> Result<Arc<Toolbox>, ToolboxError>;

    /// Admits one child of a parent at `parent_depth`, as the `index`-th of its call.
    /// Counts it against the tree's agent total when admitted.
    fn admit_child(&self, parent_depth: usize, index: usize) -> Result<(), LimitHit>;

    /// Admits one model step of about `estimate` tokens: reserves them against the
    /// token budget and counts the step against the tree's total.
    fn admit_step(&self, estimate: u64) -> Result<(), LimitHit>;

    /// Settles a model call that reserved `reserved` tokens (usage is zero for a
    /// call that failed or was abandoned).
    fn settle(&self, usage: &Usage, reserved: u64);

    /// Waits for a live-agent slot. `None` when live agents are not limited.
    fn acquire_slot(&self, priority: SlotPriority) -> BoxFuture<'static, Option<Slot>>;

    /// Joins the line for `count` live slots at once, for the children of one
    /// launch, served in turn at `priority` as one waiter. By default, a
    /// wait per child ([`acquire_slot`](Self::acquire_slot)).
    fn acquire_slots(&self, priority: SlotPriority, count: usize) -> SlotLine {
        SlotLine::Each((0..count).map(|_| self.acquire_slot(priority)).collect())
    }

    /// Waits until the tree's store takes writes again, and this process
    /// has written recently enough to still hold the tree; `None` when a
    /// model request may go now (always, without a store). An agent asks
    /// before each model request: no step is taken that could not be
    /// recorded, or that another process may be taking too.
    fn store_ready(&self) -> Option<BoxFuture<'static, ()>> {
        None
    }

    /// Waits until every event the tree's agents emitted so far is in the
    /// store; `None` when nothing need wait (the tree is not stored). A tool
    /// call that may change something (not [`Tool::is_read_only`]) starts
    /// only then, so a process killed after its effect cannot have lost the
    /// record of what led to it: a resumed run never does that work again
    /// from an earlier point (re-reading a file it has already edited). An
    /// error (`FailureKind::Store`): the store failed for good, and the call
    /// is not run.
    ///
    /// [`Tool::is_read_only`]: crate::tool::Tool::is_read_only
    fn stored(&self) -> Option<BoxFuture<'static, Result<(), crate::failure::Failure>>> {
        None
    }

    /// Publishes an event about the run `run_id` (the tree numbers it).
    fn emit(&self, run_id: &RunId, kind: EventKind);

    /// An agent actor started: the supervisor may now cancel it by run id.
    /// `actor` is the agent's actor (its messages are `AgentMsg`; the port
    /// stays free of the actor's types, so the actor module depends on the
    /// port and not the other way round).
    fn actor_started(&self, run_id: &RunId, actor: &ActorCell);

    /// An agent actor's state was dropped: it is gone.
    fn actor_stopped(&self, run_id: &RunId);

    /// Whether the tree is stored: its agents then emit a checkpoint at every
    /// step boundary and keep each raw model reply in their events.
    fn durable(&self) -> bool {
        false
    }

    /// Whether the tree goes on from a previous run of it (a resume or a
    /// replay): only then can [`recovered`](Self::recovered) know a run, and
    /// an agent skips making the run id text to ask it otherwise. An
    /// implementation that does not say is asked every time.
    fn recovering(&self) -> bool {
        true
    }

    /// What a resumed tree already knows of the run `run_id` (nothing for a new tree).
    fn recovered(&self, run_id: &RunId) -> Option<Recovered> {
        let _ = run_id;
        None
    }

    /// When the tree's deadline falls (`None`: it has none); a model
    /// request carries it, so a client never waits for a retry beyond it.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        None
    }

    /// Whether a spent budget (steps, tokens, credits) pauses the tree's
    /// agents instead of failing them (`on_budget = "pause"`, semantics §13).
    fn pauses_on_budget(&self) -> bool {
        false
    }

    /// The steers a resumed or replayed tree gives the run `run_id` back:
    /// those no checkpoint it starts from holds (semantics §9; none for a
    /// new tree).
    fn steers(&self, run_id: &RunId) -> Vec<crate::steer::Steer> {
        let _ = run_id;
        Vec::new()
    }

    /// Where a resumed or replayed tree's run `run_id` takes its background
    /// reports: the deliveries its journal recorded that no checkpoint it
    /// starts from holds (semantics §15; none for a new tree).
    fn deliveries(&self, run_id: &RunId) -> Vec<crate::checkpoint::Scheduled> {
        let _ = run_id;
        Vec::new()
    }

    /// Whether a person allowed every call of `tool` (by the name templates
    /// and policies use) in this tree for good (semantics §12, "always
    /// allow"): such a call runs without asking. None by default.
    fn always_allowed(&self, tool: &str) -> bool {
        let _ = tool;
        false
    }

    /// The decisions on tool calls a resumed or replayed tree recorded for
    /// the run `run_id`, by call id (semantics §12; none for a new tree).
    fn decisions(
        &self,
        run_id: &RunId,
    ) -> std::collections::HashMap<String, crate::approval::Decision> {
        let _ = run_id;
        std::collections::HashMap::new()
    }

    /// Where the tree's agents work (the workspace tools' directory), if it
    /// has one. None by default.
    fn workspace(&self) -> Option<Arc<dyn crate::tool::Workspace>> {
        None
    }

    /// The worktree report a resumed or replayed tree recorded for the run
    /// `run_id` (`worktreeSealed`), if it recorded one.
    fn worktree_report(&self, run_id: &RunId) -> Option<crate::worktree::WorktreeReport> {
        let _ = run_id;
        None
    }

    /// The tree's lifecycle hooks (Claude Code's `PreToolUse` and the
    /// others), if it has any. None by default.
    fn lifecycle(&self) -> Option<Arc<dyn crate::lifecycle::Lifecycle>> {
        None
    }

    /// The `PreToolUse` verdicts a resumed or replayed tree recorded for the
    /// run `run_id`, by call id: taken instead of running the hooks again
    /// (none for a new tree).
    fn hook_verdicts(
        &self,
        run_id: &RunId,
    ) -> std::collections::HashMap<String, crate::lifecycle::Verdict> {
        let _ = run_id;
        std::collections::HashMap::new()
    }

    /// What a resumed or replayed tree recorded of the program run
    /// `run_id` (its yields, and in a resume its tools' results): its
    /// program, started again, is held to it (issue 37). None for a new
    /// tree.
    fn program_record(&self, run_id: &RunId) -> Option<crate::durable::ProgramRecord> {
        let _ = run_id;
        None
    }

    /// The compactions a resumed or replayed tree recorded for the run
    /// `run_id` (`historyCompacted`): each is applied again before its
    /// step instead of asking the model for the summary again (issue 37).
    /// None for a new tree.
    fn compactions(&self, run_id: &RunId) -> Vec<crate::compact::Compacted> {
        let _ = run_id;
        Vec::new()
    }
}

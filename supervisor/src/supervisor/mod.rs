//! The supervisor: starts trees from a template and a prompt, owns what is
//! tree-wide (limits, deadline, cancellation, events, the run registry) and
//! answers for any run by id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use arbor_actors::history::History;
use arbor_actors::steer::SteerLimits;
use arbor_actors::sync::LockExt as _;
use arbor_actors::{AgentMsg, AgentSnapshot, AgentState, CancelReason, RunId, RunResult, TreeId};
use ractor::ActorRef;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::bus::{EventBus, EventStream};
use crate::catalog::Catalog;
use crate::error::Error;
use crate::limits::TreeLimits;
use crate::registry::{Registry, Retain};
use crate::store::{DEFAULT_FAIL_AFTER, Store, StoreWriter};
use crate::tree::TreeContext;

/// What to start: an agent type, its prompt and params.
#[derive(Clone, Debug, Default)]
pub struct StartRequest {
    /// The root's agent type: a template id, or a name that matches exactly
    /// one template (see [`Catalog::find_template`]).
    pub agent: String,
    /// The root's prompt.
    pub prompt: String,
    /// The root's params: a JSON object, checked against its template's
    /// input schema; `None`: no params.
    pub params: Option<Value>,
    /// Limits for this tree instead of the supervisor's defaults.
    pub limits: Option<TreeLimits>,
    /// Run every agent of the tree on this model instead of its template's.
    pub model: Option<String>,
    /// A fixed tree id (ids of every run derive from it); a fresh one
    /// ([`TreeId::generate`]) when `None`.
    pub tree_id: Option<TreeId>,
    /// A conversation the root starts with, before its prompt (shared, not copied).
    pub history: Option<History>,
    /// Where the templates came from (a config file), kept with a stored tree so
    /// it can be resumed or replayed with the same ones.
    pub origin: Option<String>,
    /// Which turn of its tree this is (semantics §14): 0 for a new tree; the
    /// root of turn `n` is `T/0~n`, the same agent (`T/0`) as every turn's.
    pub turn: u32,
    /// What the tree is started with, as its builder wrote it down (the
    /// facade's config, without secrets; opaque here): stored with the tree,
    /// so resume and replay use what it started with, not what a file says
    /// now. `None`: the supervisor's own (see [`Supervisor::with_config`]).
    pub config: Option<Arc<str>>,
    /// Who starts it (a service's named API caller): stored with a new
    /// tree as its owner, who may see and control it. Ignored when the tree
    /// is stored already (a resume, a turn): its owner never changes.
    pub principal: Option<String>,
    /// Where to post this run's completion webhook when it ends (an `http`
    /// or `https` URL, checked by [`check_webhook`](crate::request::check_webhook)):
    /// journaled with a new tree or a later turn, keyed by the run it
    /// reports (the turn's root), so its delivery survives a restart; it
    /// needs a store. Ignored for a resumed tree (its webhook is on record
    /// already).
    pub webhook: Option<String>,
    /// When the tree first started (ms since the Unix epoch), for a tree
    /// started again (a resume, a replay, a later turn): what fills a
    /// prompt's date placeholder. `None`: now.
    pub started_ms: Option<u64>,
}

/// Builds the catalog of a stored tree's config, for a supervisor that runs
/// every tree on the config it started with ([`Supervisor::with_catalogs`]).
/// `Err` says why the config cannot be built here ([`Error::TreeConfig`]).
pub type CatalogResolver =
    Box<dyn Fn(&str) -> Result<Arc<Catalog>, crate::error::BoxError> + Send + Sync>;

/// What a JSON value is, when it is not an object (params must be one).
fn not_an_object(value: &Value) -> Option<&'static str> {
    Some(match value {
        Value::Object(_) => return None,
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
    })
}

type Trees = Arc<Mutex<HashMap<Arc<str>, (Weak<TreeContext>, ActorRef<AgentMsg>)>>>;

/// Starts trees and answers for them: their events, their runs' states by
/// run id, cancellation, and (with a store) resume and replay.
pub struct Supervisor {
    catalog: Arc<Catalog>,
    /// What this supervisor's catalog was built from (see `StartRequest::config`).
    config: Option<Arc<str>>,
    /// The catalogs of other configs, for trees that started on one.
    catalogs: Option<CatalogResolver>,
    limits: TreeLimits,
    bus: EventBus,
    registry: Arc<Registry>,
    trees: Trees,
    store: Option<(Arc<dyn Store>, Arc<StoreWriter>)>,
    /// Held by each tree's deadline timer while it waits (counted by
    /// `retained`).
    deadlines: Arc<()>,
    /// The tool calls that wait for a person's decision, in every tree.
    approvals: Arc<crate::approvals::Approvals>,
    /// Per running tree: set once it is gone (every agent and handle).
    gone: Arc<Mutex<HashMap<Arc<str>, tokio::sync::watch::Receiver<bool>>>>,
    /// How much steering a run may hold before it takes it (see `steer`).
    steer_limits: SteerLimits,
    /// How long the store may be down before the trees are given up.
    store_fail_after: std::time::Duration,
    /// Turns one tree may have queued (see `start_turn`).
    turn_queue_limit: usize,
    /// Whether a request's workspace must be inside the config's roots (a
    /// service), rather than anywhere (the CLI's own directory).
    confined_workspaces: bool,
}

/// A started tree: its ids, its events, and its result.
pub struct TreeHandle {
    /// The tree's id.
    pub tree_id: TreeId,
    /// The root's run id.
    pub root_run_id: RunId,
    root: ActorRef<AgentMsg>,
    result: oneshot::Receiver<RunResult>,
    /// The root actor's task: done once the actor (and every agent below it) is gone.
    root_task: ractor::concurrency::JoinHandle<()>,
    ctx: Arc<TreeContext>,
}

impl Supervisor {
    /// A supervisor of this catalog, whose trees run under `limits` unless a
    /// start request brings its own; it keeps every run's final state.
    pub fn new(catalog: Catalog, limits: TreeLimits) -> Self {
        Self::with_retention(catalog, limits, Retain::All)
    }

    /// Like [`new`](Self::new), keeping only the final states `retain` says
    /// (for [`finished_state`](Self::finished_state) and [`state`](Self::state)).
    pub fn with_retention(catalog: Catalog, limits: TreeLimits, retain: Retain) -> Self {
        let bus = EventBus::default();
        let approvals = Arc::new(crate::approvals::Approvals::default());
        let follow = approvals.clone();
        bus.observe(move |event| follow.observe(event));
        Supervisor {
            catalog: Arc::new(catalog),
            config: None,
            catalogs: None,
            limits,
            bus,
            registry: Arc::new(Registry::new(retain)),
            trees: Arc::new(Mutex::new(HashMap::new())),
            store: None,
            deadlines: Arc::new(()),
            approvals,
            gone: Arc::new(Mutex::new(HashMap::new())),
            steer_limits: SteerLimits::default(),
            store_fail_after: DEFAULT_FAIL_AFTER,
            turn_queue_limit: turns::DEFAULT_TURN_QUEUE,
            confined_workspaces: false,
        }
    }

    /// Takes a start request's workspace (`limits.workspace`) only inside
    /// the config's `[workspace] roots`, and none when it names no roots:
    /// what a service, whose callers are not on this machine, wants.
    pub fn confine_workspaces(mut self) -> Self {
        self.confined_workspaces = true;
        self
    }

    /// Caps the steering messages a run holds before its next step takes
    /// them into its history (default [`SteerLimits::default`]): a message
    /// beyond is refused ([`SteerRefused::Full`](arbor_actors::steer::SteerRefused::Full)), not queued.
    pub fn with_steer_limits(mut self, limits: SteerLimits) -> Self {
        self.steer_limits = limits;
        self
    }

    /// Names what this supervisor's catalog was built from; it is stored with
    /// every tree started here that brings no config of its own.
    pub fn with_config(mut self, config: Arc<str>) -> Self {
        self.config = Some(config);
        self
    }

    /// Runs every resumed tree on the config it started with: a tree whose
    /// stored config differs from this supervisor's gets the catalog
    /// `resolve` builds from it. Without this, a tree resumed here runs on
    /// this supervisor's catalog, and that change of config is recorded with
    /// the tree (an explicit override, as `arbor resume --config` is).
    pub fn with_catalogs(mut self, resolve: CatalogResolver) -> Self {
        self.catalogs = Some(resolve);
        self
    }

    /// The catalog new trees run on.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The limits of a tree whose start request brings none.
    pub fn default_limits(&self) -> &TreeLimits {
        &self.limits
    }

    /// The bus every event of every tree goes out on.
    pub fn events(&self) -> &EventBus {
        &self.bus
    }

    /// Every event of every tree from now on.
    pub fn subscribe(&self) -> EventStream {
        self.bus.subscribe()
    }

    /// The final state of a finished run.
    pub fn finished_state(&self, run_id: &RunId) -> Option<Arc<AgentState>> {
        self.registry.get(run_id)
    }

    /// The current state of a live run, or the final state of a finished one.
    pub async fn state(&self, run_id: &RunId) -> Result<AgentState, Error> {
        if let Some(state) = self.live_state(run_id).await {
            return Ok(state);
        }
        self.finished_state(run_id)
            .map(|s| (*s).clone())
            .ok_or_else(|| Error::UnknownRun(run_id.clone()))
    }

    /// The current state of a run an actor runs now (asked of the actor).
    pub async fn live_state(&self, run_id: &RunId) -> Option<AgentState> {
        let actor = self.live_actor(run_id)?;
        let snapshot: AgentSnapshot = ractor::call!(actor, AgentMsg::Status).ok()?;
        Some(snapshot.state)
    }

    /// Agent actors alive in every tree.
    pub fn live_actors(&self) -> usize {
        self.contexts().iter().map(|c| c.live_count()).sum()
    }

    /// Whether a tree with this id runs in this supervisor.
    pub fn is_running(&self, tree_id: &TreeId) -> bool {
        self.trees
            .locked()
            .get(tree_id.as_str())
            .is_some_and(|(ctx, _)| ctx.strong_count() > 0)
    }

    /// What this supervisor holds for trees: entries of its tree map, and
    /// deadline timers still waiting. Both count running trees only: a tree
    /// that has ended (and whose handle is gone) leaves nothing behind.
    #[cfg(test)]
    pub(crate) fn retained(&self) -> (usize, usize) {
        let trees = self.trees.locked().len();
        (trees, Arc::strong_count(&self.deadlines) - 1)
    }

    fn contexts(&self) -> Vec<Arc<TreeContext>> {
        self.trees
            .locked()
            .values()
            .filter_map(|(t, _)| t.upgrade())
            .collect()
    }

    fn live_actor(&self, run_id: &RunId) -> Option<ActorRef<AgentMsg>> {
        self.contexts().iter().find_map(|c| c.live_actor(run_id))
    }
}

/// Cancels a tree from anywhere (cloneable; outlives the handle).
#[derive(Clone)]
pub struct Canceller(ActorRef<AgentMsg>);

impl Canceller {
    /// Cancels the whole tree (nothing happens if it has ended).
    pub fn cancel(&self) {
        let _ = self.0.cast(AgentMsg::Cancel(CancelReason::Requested));
    }
}

impl TreeHandle {
    /// Cancels the whole tree.
    pub fn cancel(&self) {
        self.canceller().cancel();
    }

    /// A handle that cancels this tree from anywhere, also after this
    /// handle is gone.
    pub fn canceller(&self) -> Canceller {
        Canceller(self.root.clone())
    }

    /// Agent actors alive in this tree.
    pub fn live_actors(&self) -> usize {
        self.ctx.live_count()
    }

    /// Agents admitted to the tree so far, the root included.
    pub fn agents(&self) -> usize {
        self.ctx.budget.agents()
    }

    /// Model steps taken in the tree so far.
    pub fn steps(&self) -> u64 {
        self.ctx.budget.steps()
    }

    /// Tokens the tree's model calls used so far (input and output).
    pub fn tokens(&self) -> u64 {
        self.ctx.budget.tokens()
    }

    /// Waits for the root's final result, and for its actor to be gone (so no
    /// actor of the tree is live when this returns).
    pub async fn wait(self) -> Result<RunResult, Error> {
        let result = self.result.await;
        let _ = self.root_task.await;
        result.map_err(|_| Error::Lost(self.tree_id.clone()))
    }
}

/// A fresh tree id: `t` and a UUIDv7's 32 hex digits, time-ordered and
/// unique across processes (`TreeId::generate`). (To subscribe to a tree's
/// events before it starts, pick its id with this and pass it in
/// `StartRequest::tree_id`.)
pub fn new_tree_id() -> TreeId {
    TreeId::generate()
}

mod adopt;
mod approval_rules;
mod control;
mod start;
mod storage;
mod stored;
mod turns;

pub use approval_rules::AlwaysAllowedNow;
pub use stored::{BudgetOutcome, CancelOutcome, Target};

pub use turns::{
    DEFAULT_TURN_QUEUE, Multitask, Queued, TurnDecision, TurnRequest, TurnStart, TurnsNow,
    decide_turn,
};

#[cfg(test)]
mod tests;

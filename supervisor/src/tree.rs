//! One tree's context: what its agents reach through `TreeHooks` (catalog,
//! budget, live slots, ids, events) and the actors alive in it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use arbor_actors::TreeId;
use arbor_actors::hooks::{RunIds, Slot, SlotLine, SlotPriority};
use arbor_actors::idmap::{IdMap, IdSet};
use arbor_actors::sync::LockExt;
use arbor_actors::toolbox::{Toolbox, ToolboxError};
use arbor_actors::{
    AgentMsg, AgentTemplate, Event, EventKind, LimitHit, Model, Recovered, RunId, TreeHooks, Usage,
};
use futures::FutureExt;
use futures::future::BoxFuture;
use ractor::ActorRef;

use crate::bus::EventBus;
use crate::catalog::Catalog;
use crate::limits::{Budget, TreeLimits};
use crate::recovery::{Recorded, Recovery};
use crate::registry::Registry;
use crate::store::StoreWriter;

pub(crate) struct TreeContext {
    pub(crate) tree_id: TreeId,
    catalog: Arc<Catalog>,
    pub(crate) budget: Budget,
    bus: EventBus,
    registry: Arc<Registry>,
    /// Used for every agent of the tree instead of the template's model.
    model_override: Option<Arc<dyn Model>>,
    seq: AtomicU64,
    /// Held while an event is numbered and published, so every subscriber sees
    /// a tree's events in `seq` order.
    order: Mutex<()>,
    live: Mutex<IdMap<RunId, ActorRef<AgentMsg>>>,
    /// Children spawned whose actor has not started yet (waiting for a live
    /// slot or a retry), by a hash of their run id: a cancel by run id
    /// reaches them through their parent (read from the run id). A hash, not
    /// the id's text: the 10^8-agent tree holds ~10^7 at once (issue 34).
    waiting: Mutex<IdSet<u64>>,
    /// Whether the tree is stored (its agents checkpoint every step).
    durable: bool,
    /// What a resumed or replayed tree starts from.
    recovery: Option<Arc<Recovery>>,
    /// Models wrapped to serve recorded replies first (resume and replay).
    recorded: Mutex<HashMap<String, Arc<dyn Model>>>,
    /// A replay: a reply missing from the tape fails instead of calling the model.
    replay: bool,
    /// Toolboxes cut to the tree's tool policy, by template (with the catalog's
    /// toolbox each was cut from, so a changed tool list is cut again).
    toolboxes: Mutex<ToolboxCache>,
    /// Called once when the context goes: its tree has ended and nothing
    /// holds it any more (what the supervisor keeps of the tree goes then).
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
    /// When the tree (or its resume) started: its deadline runs from here.
    started: tokio::time::Instant,
    /// Where its agents work, opened once for the tree (issue 36).
    workspace: Option<Arc<dyn arbor_actors::tool::Workspace>>,
    /// The store's writer, for a stored tree: a model request waits while
    /// the store is down or this process may have lost its claim, and a
    /// tool call that may change something until what led to it is stored.
    store: Option<Arc<StoreWriter>>,
    /// The values of its templates' tree-dependent placeholders, and each
    /// template expanded with them once used (see `prompt_context`).
    prompts: Option<(crate::prompt_context::Values, Expanded)>,
}

impl Drop for TreeContext {
    fn drop(&mut self) {
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

type ToolboxCache = HashMap<String, (Arc<Toolbox>, Arc<Toolbox>)>;
/// Templates with a tree's placeholders filled, by id.
type Expanded = Mutex<HashMap<String, Arc<AgentTemplate>>>;

impl TreeContext {
    pub(crate) fn new(
        tree_id: TreeId,
        catalog: Arc<Catalog>,
        limits: TreeLimits,
        bus: EventBus,
        registry: Arc<Registry>,
        model_override: Option<Arc<dyn Model>>,
    ) -> Self {
        TreeContext {
            tree_id,
            catalog,
            budget: Budget::new(limits),
            bus,
            registry,
            model_override,
            seq: AtomicU64::new(0),
            order: Mutex::new(()),
            live: Mutex::new(IdMap::default()),
            waiting: Mutex::new(IdSet::default()),
            durable: false,
            recovery: None,
            recorded: Mutex::new(HashMap::new()),
            replay: false,
            toolboxes: Mutex::new(HashMap::new()),
            on_drop: None,
            started: tokio::time::Instant::now(),
            store: None,
            prompts: None,
            workspace: None,
        }
    }

    /// The tree's workspace, opened.
    pub(crate) fn workspace(
        mut self,
        workspace: Option<Arc<dyn arbor_actors::tool::Workspace>>,
    ) -> Self {
        self.workspace = workspace;
        self
    }

    /// Holds each model request while the store is down (see
    /// `WriterHealth::ready`), and each tool call that may change something
    /// until the tree's events before it are stored.
    pub(crate) fn store_writer(mut self, writer: Option<Arc<StoreWriter>>) -> Self {
        self.store = writer;
        self
    }

    /// Fills its templates' tree-dependent placeholders with `values`.
    pub(crate) fn prompt_values(mut self, values: Option<crate::prompt_context::Values>) -> Self {
        self.prompts = values.map(|v| (v, Mutex::new(HashMap::new())));
        self
    }

    /// `template` as this tree runs it: its placeholders filled.
    pub(crate) fn expanded(&self, template: &Arc<AgentTemplate>) -> Arc<AgentTemplate> {
        let Some((values, cache)) = &self.prompts else {
            return template.clone();
        };
        cache
            .locked()
            .entry(template.id.clone())
            .or_insert_with(|| {
                crate::prompt_context::expand(template, values)
                    .map_or_else(|| template.clone(), Arc::new)
            })
            .clone()
    }

    /// Calls `f` when the context goes (once every agent of the tree and
    /// every handle on it are gone).
    pub(crate) fn on_drop(mut self, f: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.on_drop = Some(Box::new(f));
        self
    }

    /// Checkpoints every step (the supervisor stores the tree).
    pub(crate) fn durable(mut self, on: bool) -> Self {
        self.durable = on;
        self
    }

    /// Starts from what a previous run of this tree left: events continue its
    /// numbering (a resume past any number a reader may have seen: see
    /// `RESUME_SEQ_GAP`) and its budget goes on from what it had spent.
    pub(crate) fn recovering(mut self, recovery: Arc<Recovery>, replay: bool) -> Self {
        let gap = if replay {
            0
        } else {
            crate::store::RESUME_SEQ_GAP
        };
        self.seq = AtomicU64::new(recovery.last_seq + gap);
        self.budget.restore(&recovery.spent);
        self.budget.restore_raised(recovery.raised);
        self.recovery = Some(recovery);
        self.replay = replay;
        self
    }

    pub(crate) fn recovery(&self) -> Option<&Arc<Recovery>> {
        self.recovery.as_ref()
    }

    /// The model `name`, serving recorded replies first when the tree has some.
    fn served(&self, name: &str, live: Option<Arc<dyn Model>>) -> Option<Arc<dyn Model>> {
        let Some(recovery) = &self.recovery else {
            return live;
        };
        let mut recorded = self.recorded.locked();
        if let Some(model) = recorded.get(name) {
            return Some(model.clone());
        }
        if live.is_none() && !self.replay {
            return None;
        }
        let model: Arc<dyn Model> = Arc::new(Recorded {
            name: name.to_owned(),
            recovery: recovery.clone(),
            live: if self.replay { None } else { live },
        });
        recorded.insert(name.to_owned(), model.clone());
        Some(model)
    }

    pub(crate) fn live_actor(&self, run_id: &RunId) -> Option<ActorRef<AgentMsg>> {
        self.live.locked().get(run_id).cloned()
    }

    /// The running parent of a child that was spawned but has not started
    /// (it waits for a live slot or a retry): a cancel by run id reaches it
    /// through its parent, which alone holds its plan.
    pub(crate) fn waiting_parent(&self, run_id: &RunId) -> Option<RunId> {
        if run_id.tree() != &self.tree_id || !self.waiting.locked().contains(&id_hash(run_id)) {
            return None;
        }
        let parent = run_id.parent()?;
        let live = self.live.locked();
        (!live.contains_key(run_id) && live.contains_key(&parent)).then_some(parent)
    }

    pub(crate) fn live_count(&self) -> usize {
        self.live.locked().len()
    }

    /// Raises the tree's budgets and wakes its agents paused on them.
    /// Journaled as a `limitsRaised` event of the root; returns the budgets
    /// in force.
    pub(crate) fn raise(
        &self,
        set: crate::Raised,
        add: crate::Raised,
    ) -> Result<crate::Raised, crate::limits::RaiseRefused> {
        let raised = self.budget.raise(set, add)?;
        let root = self.tree_id.root();
        self.emit(
            &root,
            EventKind::LimitsRaised {
                max_steps: raised.max_steps,
                max_tokens: raised.max_tokens,
                max_credits: raised.max_credits,
            },
        );
        let actors: Vec<ActorRef<AgentMsg>> = self.live.locked().values().cloned().collect();
        for actor in actors {
            let _ = actor.cast(AgentMsg::BudgetRaised);
        }
        Ok(self.budget.budgets())
    }

    /// Ids of the root run of turn `turn`: `T/0`, then `T/0~n` for a
    /// follow-up turn (the same agent, `T/0`, in every turn).
    pub(crate) fn root_ids(&self, turn: u32) -> RunIds {
        let root = self.tree_id.root();
        RunIds {
            run_id: root.retry(turn),
            agent_id: root.agent_id(),
        }
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl TreeHooks for TreeContext {
    fn tree_id(&self) -> &TreeId {
        &self.tree_id
    }

    fn template(&self, id: &str) -> Option<Arc<AgentTemplate>> {
        self.catalog.template(id).map(|t| self.expanded(t))
    }

    fn knows_agent(&self, requested: &str) -> bool {
        self.catalog.knows_agent(requested)
    }

    fn model(&self, name: &str) -> Option<Arc<dyn Model>> {
        let live = match &self.model_override {
            Some(model) => Some(model.clone()),
            None => self.catalog.model(name).cloned(),
        };
        self.served(name, live)
    }

    /// The template's toolbox, without what the tree's tool policy refuses.
    fn toolbox(&self, template: &AgentTemplate) -> Result<Arc<Toolbox>, ToolboxError> {
        let base = self
            .catalog
            .toolbox(&template.id)
            .ok_or_else(|| ToolboxError::UnknownAgent(template.id.to_string()))?;
        let policy = &self.budget.limits().tools;
        if policy.is_empty() {
            return Ok(base);
        }
        let mut cache = self.toolboxes.locked();
        if let Some((from, cut)) = cache.get(&template.id)
            && Arc::ptr_eq(from, &base)
        {
            return Ok(cut.clone());
        }
        let mut cut = base.restricted(|names| policy.allows_any(names));
        if policy.approves() {
            cut = cut.with_approval(|names| policy.needs_approval_any(names));
        }
        let cut = Arc::new(cut);
        cache.insert(template.id.clone(), (base, cut.clone()));
        Ok(cut)
    }

    fn admit_child(&self, parent_depth: usize, index: usize) -> Result<(), LimitHit> {
        self.budget.admit_child(parent_depth, index)
    }

    fn admit_step(&self, estimate: u64) -> Result<(), LimitHit> {
        self.budget.admit_step(estimate)
    }

    fn pauses_on_budget(&self) -> bool {
        self.budget.pauses()
    }

    fn settle(&self, usage: &Usage, reserved: u64) {
        self.budget.settle(usage, reserved);
    }

    fn acquire_slot(&self, priority: SlotPriority) -> BoxFuture<'static, Option<Slot>> {
        match &self.budget.slots {
            None => futures::future::ready(None).boxed(),
            Some(slots) => slots.acquire(priority),
        }
    }

    fn acquire_slots(&self, priority: SlotPriority, count: usize) -> SlotLine {
        match &self.budget.slots {
            None => SlotLine::Unlimited,
            Some(slots) => slots.line(priority, count),
        }
    }

    fn emit(&self, run_id: &RunId, kind: EventKind) {
        if let Some(state) = kind.final_state() {
            self.registry.record(state);
        }
        match &kind {
            EventKind::ChildSpawned { child_run_id, .. } => {
                self.waiting.locked().insert(id_hash(child_run_id));
            }
            EventKind::ChildFinished { child_run_id, .. } => {
                self.waiting.locked().remove(&id_hash(child_run_id));
            }
            _ => {}
        }
        let _order = self.order.locked();
        let event = Event {
            seq: self.seq.fetch_add(1, Ordering::AcqRel) + 1,
            tree_id: self.tree_id.clone(),
            run_id: run_id.clone(),
            at_ms: now_ms(),
            kind,
        };
        tracing::debug!(tree = %event.tree_id, run = %event.run_id, event = event.kind.name());
        self.bus.publish(event);
    }

    fn actor_started(&self, run_id: &RunId, actor: &ractor::ActorCell) {
        // An agent's actor: its messages are `AgentMsg`.
        self.live
            .locked()
            .insert(run_id.clone(), ActorRef::from(actor.clone()));
        self.waiting.locked().remove(&id_hash(run_id));
    }

    fn actor_stopped(&self, run_id: &RunId) {
        self.live.locked().remove(run_id);
    }

    fn durable(&self) -> bool {
        self.durable
    }

    fn store_ready(&self) -> Option<futures::future::BoxFuture<'static, ()>> {
        let health = self.store.as_ref()?.health();
        (!health.ready_for(&self.tree_id)).then(|| health.until_ready_for(self.tree_id.clone()))
    }

    fn stored(&self) -> Option<BoxFuture<'static, Result<(), arbor_actors::Failure>>> {
        let writer = self.store.clone()?;
        let tree_id = self.tree_id.clone();
        Some(Box::pin(async move {
            writer.flush().await.map_err(|e| {
                arbor_actors::Failure::new(arbor_actors::FailureKind::Store, e.to_string())
            })?;
            // Another process took the tree over: nothing of it is written
            // here any more, so nothing may be done on its record.
            match writer.fenced(&tree_id) {
                Some(fenced) => Err(arbor_actors::Failure::new(
                    arbor_actors::FailureKind::Fenced,
                    crate::Error::from(fenced).to_string(),
                )),
                None => Ok(()),
            }
        }))
    }

    fn recovering(&self) -> bool {
        self.recovery.is_some()
    }

    fn recovered(&self, run_id: &RunId) -> Option<Recovered> {
        self.recovery.as_ref()?.recovered(run_id)
    }

    fn decisions(
        &self,
        run_id: &RunId,
    ) -> std::collections::HashMap<String, arbor_actors::approval::Decision> {
        self.recovery
            .as_ref()
            .map(|r| r.decisions_for(run_id))
            .unwrap_or_default()
    }

    fn lifecycle(&self) -> Option<Arc<dyn arbor_actors::lifecycle::Lifecycle>> {
        self.catalog.lifecycle().cloned()
    }

    fn hook_verdicts(
        &self,
        run_id: &RunId,
    ) -> std::collections::HashMap<String, arbor_actors::lifecycle::Verdict> {
        self.recovery
            .as_ref()
            .map(|r| r.hook_verdicts_for(run_id))
            .unwrap_or_default()
    }

    fn workspace(&self) -> Option<Arc<dyn arbor_actors::tool::Workspace>> {
        self.workspace.clone()
    }

    fn program_record(&self, run_id: &RunId) -> Option<arbor_actors::durable::ProgramRecord> {
        self.recovery.as_ref().and_then(|r| r.program_for(run_id))
    }

    fn compactions(&self, run_id: &RunId) -> Vec<arbor_actors::compact::Compacted> {
        self.recovery
            .as_ref()
            .and_then(|r| r.compactions.get(&*run_id.to_string()).cloned())
            .unwrap_or_default()
    }

    fn worktree_report(&self, run_id: &RunId) -> Option<arbor_actors::worktree::WorktreeReport> {
        self.recovery
            .as_ref()
            .and_then(|r| r.worktrees.get(&run_id.to_string()).cloned())
    }

    fn steers(&self, run_id: &RunId) -> Vec<arbor_actors::steer::Steer> {
        self.recovery
            .as_ref()
            .map(|r| r.steers_for(run_id))
            .unwrap_or_default()
    }

    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.budget.limits().deadline.map(|d| self.started + d)
    }

    fn deliveries(&self, run_id: &RunId) -> Vec<arbor_actors::background::Scheduled> {
        self.recovery
            .as_ref()
            .map(|r| r.deliveries_for(run_id))
            .unwrap_or_default()
    }
}

/// A run id's hash, as the tree's set of waiting children keeps it (a
/// fixed hasher: the same id hashes alike in every call).
fn id_hash(run_id: &RunId) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    run_id.hash(&mut hasher);
    hasher.finish()
}

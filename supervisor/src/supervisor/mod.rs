//! The supervisor: starts trees from a template and a prompt, owns what is
//! tree-wide (limits, deadline, cancellation, events, the run registry) and
//! answers for any run by id.

use std::collections::HashMap;

use arbor_actors::approval::{DecideRefused, Decision};
use arbor_actors::steer::{SteerLimits, SteerRefused};
use std::str::FromStr;
use std::sync::{Arc, Mutex, Weak};

use arbor_actors::TreeHooks as _;
use arbor_actors::history::History;
use arbor_actors::spawn::input_messages;
use arbor_actors::state::Start;
use arbor_actors::sync::LockExt;
use arbor_actors::{
    AgentActor, AgentArgs, AgentMsg, AgentSnapshot, AgentState, CancelReason, EventKind, Limit,
    LimitHit, Model, Reply, RunResult, StepMachine, TreeId,
};
use arbor_actors::{Failure, FailureKind};
use ractor::{Actor, ActorRef};
use serde_json::Value;
use tokio::sync::oneshot;

use crate::Raised;
use crate::bus::{EventBus, EventStream};
use crate::catalog::Catalog;
use crate::error::{Error, StoreUse};
use crate::limits::TreeLimits;
use crate::recovery::Recovery;
use crate::registry::{Registry, Retain};
use crate::store::{
    DEFAULT_FAIL_AFTER, Fenced, Store, StoreDown, StoreWriter, TreeRecord, Write, WriterHealth,
    WriterHooks,
};
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
    /// A fixed tree id (ids of every run derive from it); random when `None`.
    pub tree_id: Option<String>,
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
}

/// Builds the catalog of a stored tree's config, for a supervisor that runs
/// every tree on the config it started with ([`Supervisor::with_catalogs`]).
pub type CatalogResolver = Box<dyn Fn(&str) -> Result<Arc<Catalog>, String> + Send + Sync>;

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
}

/// A started tree: its ids, its events, and its result.
pub struct TreeHandle {
    /// The tree's id.
    pub tree_id: Arc<str>,
    /// The root's run id.
    pub root_run_id: String,
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
        }
    }

    /// Caps the steering messages a run holds before its next step takes
    /// them into its history (default [`SteerLimits::default`]): a message
    /// beyond is refused ([`SteerRefused::Full`]), not queued.
    pub fn with_steer_limits(mut self, limits: SteerLimits) -> Self {
        self.steer_limits = limits;
        self
    }

    /// The tool calls that wait for a person's decision (semantics §12), in
    /// one tree or in all, oldest first. A restarted tree's are listed again
    /// once its agents are back at the waiting step.
    pub fn approvals(&self, tree_id: Option<&str>) -> Vec<crate::PendingApproval> {
        self.approvals.list(tree_id)
    }

    /// Decides on the waiting call `call_id` of tree `tree_id`: approve (with
    /// the model's input, or an edited one checked against the tool's schema)
    /// or deny with a reason (the model reads it). Journaled as an
    /// `approvalDecided` event; once a step's last decision is in, its calls go on.
    pub async fn decide(
        &self,
        tree_id: &str,
        call_id: &str,
        decision: Decision,
    ) -> Result<(), Error> {
        let refused = |reason| Error::DecisionRefused {
            tree_id: tree_id.to_owned(),
            call_id: call_id.to_owned(),
            reason,
        };
        let unknown = || Error::UnknownApproval {
            tree_id: tree_id.to_owned(),
            call_id: call_id.to_owned(),
        };
        let Some(run_id) = self.approvals.run_of(tree_id, call_id) else {
            // A call of a tree that has ended (cancelled, say) waits for
            // nothing any more: refused as ended (409), not unknown (404).
            return Err(match self.asked_and_ended(tree_id, call_id).await {
                true => refused(DecideRefused::Ended),
                false => unknown(),
            });
        };
        let actor = self.live_actor(&run_id).ok_or_else(unknown)?;
        let call_id = call_id.to_owned();
        match ractor::call!(actor, |reply| AgentMsg::Decide {
            call_id: call_id.clone(),
            decision: Box::new(decision),
            reply
        }) {
            Ok(answer) => answer.map_err(refused),
            Err(_) => Err(refused(DecideRefused::Ended)),
        }
    }

    /// One decision over many calls (semantics §12): every call of tree
    /// `tree_id` waiting now, or every one of the tool `tool`, gets
    /// `decision`, each as its own journaled `approvalDecided` event (so a
    /// restart takes them as recorded). An edited input is one call's:
    /// refused here. Returns the calls decided, oldest first; a tree with
    /// none waiting is refused as [`Error::UnknownApproval`] naming `*` (or
    /// as ended, when it has).
    pub async fn decide_all(
        &self,
        tree_id: &str,
        tool: Option<&str>,
        decision: Decision,
    ) -> Result<Vec<String>, Error> {
        let label = tool.map_or_else(|| "*".to_owned(), |t| format!("* ({t})"));
        if let Decision::Approve { input: Some(_) } = decision {
            return Err(Error::DecisionRefused {
                tree_id: tree_id.to_owned(),
                call_id: label,
                reason: DecideRefused::InvalidInput(
                    "an edited input is one call's: approve the calls one by one".into(),
                ),
            });
        }
        let calls = self.approvals.covered(tree_id, tool);
        if calls.is_empty() {
            return Err(match self.tree_ended(tree_id).await {
                true => Error::DecisionRefused {
                    tree_id: tree_id.to_owned(),
                    call_id: label,
                    reason: DecideRefused::Ended,
                },
                false => Error::UnknownApproval {
                    tree_id: tree_id.to_owned(),
                    call_id: label,
                },
            });
        }
        let mut decided = Vec::with_capacity(calls.len());
        for call in calls {
            // A call whose run ended meanwhile is no longer decided.
            match self.decide(tree_id, &call, decision.clone()).await {
                Ok(()) => decided.push(call),
                Err(Error::UnknownApproval { .. } | Error::DecisionRefused { .. }) => {}
                Err(other) => return Err(other),
            }
        }
        Ok(decided)
    }

    /// Whether the call `call_id` of tree `tree_id` was asked for and never
    /// decided, and the tree has ended (a cancelled tree's waiting call): a
    /// decision on it is refused as ended. A call decided already waits
    /// for nothing: that one is unknown. Without a store, whether the tree
    /// has ended ([`tree_ended`](Self::tree_ended)).
    async fn asked_and_ended(&self, tree_id: &str, call_id: &str) -> bool {
        if self.store.is_none() || self.is_running(tree_id) {
            return self.tree_ended(tree_id).await;
        }
        let (tree, call) = (tree_id.to_owned(), call_id.to_owned());
        self.read_store_now(move |store| {
            if !store.status(&tree)?.is_final() {
                return Ok(false);
            }
            let journal = store.events(&tree, 0)?;
            let of_call = |kind: arbor_actors::EventType| {
                journal.iter().any(|e| {
                    e.kind == kind
                        && e.body.get("toolCallId").and_then(serde_json::Value::as_str)
                            == Some(call.as_str())
                })
            };
            Ok(of_call(arbor_actors::EventType::ApprovalRequested)
                && !of_call(arbor_actors::EventType::ApprovalDecided))
        })
        .await
        .unwrap_or(false)
    }

    /// Whether the tree `tree_id` has ended: it does not run here, and the
    /// store has it ended (or, without a store, its root's final state is
    /// still kept).
    async fn tree_ended(&self, tree_id: &str) -> bool {
        if self.is_running(tree_id) {
            return false;
        }
        if self.store.is_none() {
            return self.finished_state(&format!("{tree_id}/0")).is_some();
        }
        let tree = tree_id.to_owned();
        self.read_store_now(move |store| store.status(&tree))
            .await
            .is_ok_and(|status| status.is_final())
    }

    /// Stores every tree from now on: its runs, a checkpoint of each agent at
    /// every step boundary, its events and its model replies. Writes go through
    /// a thread of their own, in batches. If a write fails, every running tree
    /// fails with the reason and no new tree starts.
    ///
    /// A tree another process takes over (it claimed it since, see
    /// `Store::claim`) is stopped here: its agents are cancelled with the
    /// reason (they end `failed`, naming it), nothing more of it is written,
    /// and the other trees go on.
    ///
    /// A store that is down for a while (its database restarts, its
    /// connection is cut, its disk is full) fails nothing: the writer holds
    /// the writes and tries them again with backoff, the trees' agents take
    /// no new model step, and no tree starts or is claimed here, until it
    /// takes writes again ([`store_down`](Self::store_down) says why
    /// meanwhile). Only past [`with_store_fail_after`](Self::with_store_fail_after)
    /// (60 s by default) are the trees released and failed here.
    pub fn with_store(mut self, store: Arc<dyn Store>) -> Result<Self, Error> {
        let trees = self.trees.clone();
        let fenced_trees = self.trees.clone();
        let health = WriterHealth::new(store.lease_ms(), self.store_fail_after);
        let hooks = WriterHooks {
            on_failure: Box::new(move |reason| {
                let roots: Vec<ActorRef<AgentMsg>> = trees
                    .locked()
                    .values()
                    .map(|(_, root)| root.clone())
                    .collect();
                for root in roots {
                    let _ = root.cast(AgentMsg::Cancel(CancelReason::Failed(Failure::new(
                        FailureKind::Store,
                        reason.clone(),
                    ))));
                }
            }),
            on_fenced: Box::new(move |fenced: Fenced| {
                let root = fenced_trees
                    .locked()
                    .get(fenced.tree_id.as_str())
                    .map(|(_, r)| r.clone());
                if let Some(root) = root {
                    let reason = Error::from(fenced).to_string();
                    let _ = root.cast(AgentMsg::Cancel(CancelReason::Failed(Failure::new(
                        FailureKind::Fenced,
                        reason,
                    ))));
                }
            }),
        };
        let writer = Arc::new(StoreWriter::start(store.clone(), hooks, health)?);
        let sink = writer.clone();
        // Streaming deltas are not stored: they need not cross the queue.
        self.bus.sink(move |event| {
            if !matches!(event.kind, EventKind::ModelDelta { .. }) {
                sink.send(Write::Event(event.clone()));
            }
        });
        self.store = Some((store, writer));
        Ok(self)
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

    /// The catalog a tree with `config` runs on.
    fn catalog_for(&self, config: Option<&Arc<str>>) -> Result<Arc<Catalog>, Error> {
        match (config, &self.catalogs) {
            (Some(config), Some(resolve)) if Some(config) != self.config.as_ref() => {
                resolve(config).map_err(Error::TreeConfig)
            }
            _ => Ok(self.catalog.clone()),
        }
    }

    /// The store trees are written to; `None` without one.
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.store.as_ref().map(|(store, _)| store)
    }

    /// Hands every tree still running here over to the next process, for a
    /// shutdown: waits until everything so far is stored, then marks them
    /// interrupted (a new process resumes them at once, without waiting for
    /// this one's heartbeat to go stale) and records nothing more of them.
    /// Returns the trees handed over.
    pub async fn release(&self) -> Result<Vec<String>, Error> {
        let Some((_, writer)) = &self.store else {
            return Ok(Vec::new());
        };
        let trees: Vec<String> = self
            .contexts()
            .iter()
            .map(|c| c.tree_id.to_string())
            .collect();
        writer.flush().await?;
        writer.send(Write::Release(trees.clone()));
        writer.flush().await?;
        Ok(trees)
    }

    /// Why the store stopped taking writes for good, if it did (then no tree
    /// starts): a write it refused, or an outage longer than
    /// [`with_store_fail_after`](Self::with_store_fail_after).
    pub fn store_failure(&self) -> Option<String> {
        self.store.as_ref().and_then(|(_, writer)| writer.failure())
    }

    /// Why the store takes no writes for now, if so (its connection was
    /// lost, its disk is full): the writer tries again until it does.
    pub fn store_down(&self) -> Option<StoreDown> {
        self.store
            .as_ref()
            .and_then(|(_, writer)| writer.health().down())
    }

    /// How long the store may stay down before this process gives its trees
    /// up (releases them to the next process and fails them here) and
    /// [`store_failure`](Self::store_failure) says so. 60 s unless set.
    pub fn with_store_fail_after(mut self, fail_after: std::time::Duration) -> Self {
        self.store_fail_after = fail_after;
        if let Some((_, writer)) = &self.store {
            writer.health().set_fail_after(fail_after);
        }
        self
    }

    /// Whether this process may start or claim trees on its store now:
    /// `Ok` without a store, else the error a start gets while the store is
    /// down ([`Error::StoreUnavailable`]) or has failed ([`Error::Store`]).
    pub fn store_takes_writes(&self) -> Result<(), Error> {
        let Some((_, writer)) = &self.store else {
            return Ok(());
        };
        if let Some(reason) = writer.failure() {
            return Err(Error::Store(reason));
        }
        match writer.health().down() {
            Some(down) => Err(down.to_error()),
            None => Ok(()),
        }
    }

    /// Runs `f` on the store, on a blocking thread (store calls are
    /// synchronous; the runtime's threads must not wait on them).
    pub async fn read_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Store) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let Some((store, _)) = &self.store else {
            return Err(Error::NoStore {
                needed_for: StoreUse::Read,
            });
        };
        let store = store.clone();
        tokio::task::spawn_blocking(move || f(&*store))
            .await
            .map_err(|e| Error::Store(format!("the store reader failed: {e}")))?
    }

    /// Like [`read_store`](Self::read_store), once everything that happened
    /// so far is in the store (a run that just ended included).
    pub async fn read_store_now<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Store) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        self.flush().await?;
        self.read_store(f).await
    }

    /// Waits until everything that happened so far is in the store.
    pub async fn flush(&self) -> Result<(), Error> {
        match &self.store {
            Some((_, writer)) => writer.flush().await,
            None => Ok(()),
        }
    }

    /// Resumes a stored tree that was interrupted: runs that finished are merged
    /// from their stored final states, runs that were cut short go on from their
    /// last checkpoint, and recorded model replies are served instead of asking
    /// the model again.
    pub async fn resume(&self, tree_id: &str) -> Result<TreeHandle, Error> {
        let writer = self.writer_to_take(tree_id, StoreUse::Resume)?;
        // Atomic: of two processes resuming one tree, one gets it.
        let (record, recovery) = self
            .claim_stored(tree_id, |store, id| store.claim(id))
            .await?;
        let request = self.resumed_request(tree_id, record);
        self.go_on(writer, tree_id, request, recovery).await
    }

    /// Resumes those of the interrupted trees `tree_ids` this process can
    /// take, as [`resume`](Self::resume) resumes one, but together: one
    /// claim for all of them (`Store::claim_interrupted`: a tree that ended,
    /// that a live process runs or that another process is claiming right
    /// now is left out), one read of what they resume from
    /// (`Store::resumes`), then every tree started at once. `before` sees
    /// each tree's record just before it starts. Returns each tree claimed,
    /// with its handle or why it could not start; trees not claimed are not
    /// in it.
    pub async fn adopt(
        &self,
        tree_ids: Vec<String>,
        before: impl Fn(&TreeRecord),
    ) -> Result<Vec<(String, Result<TreeHandle, Error>)>, Error> {
        let Some((_, writer)) = &self.store else {
            return Err(Error::NoStore {
                needed_for: StoreUse::Resume,
            });
        };
        // A store that is down (or failed) is not claimed from: this
        // process could not run what it took.
        self.store_takes_writes()?;
        let ids: Vec<String> = tree_ids
            .into_iter()
            .filter(|id| !self.is_running(id))
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let read = self
            .read_store(move |store| {
                let claimed = store.claim_interrupted(&ids)?;
                let ids: Vec<String> = claimed.iter().map(|(id, _)| id.clone()).collect();
                let read = store.resumes(&ids)?;
                let mut out = Vec::with_capacity(read.len());
                for ((tree_id, epoch), read) in claimed.into_iter().zip(read) {
                    // A tree claimed that cannot be loaded fails, with the
                    // reason, instead of staying claimed (running) for ever.
                    if let Err(error) = &read {
                        let reason = format!("the tree cannot be resumed: {error}");
                        tracing::error!(tree = %tree_id, "{reason}");
                        store.fail_claimed(&tree_id, epoch, &reason)?;
                    }
                    out.push((tree_id, read));
                }
                Ok(out)
            })
            .await?;
        let starts = read.into_iter().map(|(tree_id, read)| {
            let before = &before;
            async move {
                let started = match read {
                    Ok((record, recovery)) => {
                        before(&record);
                        let request = self.resumed_request(&tree_id, record);
                        self.go_on(writer, &tree_id, request, recovery).await
                    }
                    Err(error) => Err(error),
                };
                (tree_id, started)
            }
        });
        Ok(futures::future::join_all(starts).await)
    }

    /// The request a claimed stored tree resumes with.
    fn resumed_request(&self, tree_id: &str, record: TreeRecord) -> StartRequest {
        let mut request = record.request();
        if self.catalogs.is_none() && request.config != self.config && self.config.is_some() {
            // It runs on this supervisor's catalog: say so, and record it.
            tracing::warn!(
                tree = tree_id,
                "resuming on this process's config, not the one the tree started with; \
                 the change is recorded with the tree"
            );
            request.config = self.config.clone();
        }
        request
    }

    /// The store's writer, to take the stored tree `tree_id` over with (for
    /// `needed_for`): refused without a store, or while the tree runs here.
    fn writer_to_take(&self, tree_id: &str, needed_for: StoreUse) -> Result<&StoreWriter, Error> {
        let Some((_, writer)) = &self.store else {
            return Err(Error::NoStore { needed_for });
        };
        if self.is_running(tree_id) {
            return Err(Error::TreeExists(tree_id.to_owned()));
        }
        Ok(writer)
    }

    /// Claims the stored tree `tree_id` with `claim`; its record and what the
    /// store recovers of it.
    async fn claim_stored(
        &self,
        tree_id: &str,
        claim: fn(&dyn Store, &str) -> Result<u64, Error>,
    ) -> Result<(TreeRecord, Recovery), Error> {
        self.store_takes_writes()?;
        let id = tree_id.to_owned();
        self.read_store(move |store| {
            let (record, _) = store.tree(&id)?;
            claim(store, &id)?;
            Ok((record, store.recovery(&id)?))
        })
        .await
    }

    /// Runs the claimed stored tree `tree_id` on with `request`, from what
    /// was recovered of it: its finished runs' final states are known here
    /// again, and the writer is told what the store holds of it already.
    async fn go_on(
        &self,
        writer: &StoreWriter,
        tree_id: &str,
        request: StartRequest,
        mut recovery: Recovery,
    ) -> Result<TreeHandle, Error> {
        for (state, _) in recovery.finished.values() {
            self.registry.record(state);
        }
        writer.send(Write::Known {
            tree_id: tree_id.to_owned(),
            messages: std::mem::take(&mut recovery.message_ids),
            calls: recovery.replies.keys().cloned().collect(),
            runs: std::mem::take(&mut recovery.runs),
        });
        self.begin(request, Some((Arc::new(recovery), false))).await
    }

    /// Runs a tree again on its recorded model replies only (no model is called;
    /// a missing reply fails that agent). Needs a supervisor without a store,
    /// so the replay never overwrites what it is checked against.
    /// `recorded` is what the store recovered of the tree: its replies, its
    /// steering messages (each taken again at the step it arrived in) and
    /// its decisions on tool calls (taken without asking).
    pub async fn replay(
        &self,
        request: StartRequest,
        recorded: Recovery,
    ) -> Result<TreeHandle, Error> {
        if self.store.is_some() {
            return Err(Error::ReplayWithStore);
        }
        let recovery = Recovery::replay(recorded);
        self.begin(request, Some((Arc::new(recovery), true))).await
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

    /// Starts a tree. Waits only for a live slot for the root, never for its run.
    pub async fn start(&self, request: StartRequest) -> Result<TreeHandle, Error> {
        self.begin(request, None).await
    }

    async fn begin(
        &self,
        request: StartRequest,
        recovery: Option<(Arc<Recovery>, bool)>,
    ) -> Result<TreeHandle, Error> {
        // One trace per tree: the root agent's span is a child of the span
        // this start runs in (the service's, for a tree started over HTTP).
        let caller = tracing::Span::current();
        self.store_takes_writes()?;
        let config = request.config.clone().or_else(|| self.config.clone());
        let catalog = self.catalog_for(config.as_ref())?;
        let template = catalog
            .find_template(&request.agent)
            .cloned()
            .ok_or_else(|| Error::UnknownAgent(request.agent.clone()))?;
        if let Some(kind) = request.params.as_ref().and_then(not_an_object) {
            return Err(Error::InvalidInput {
                agent: template.id.clone(),
                message: format!("params must be a JSON object, not {kind}"),
            });
        }
        template
            .check_input(Some(&request.prompt), request.params.as_ref())
            .map_err(|e| Error::InvalidInput {
                agent: template.id.clone(),
                message: e.to_string(),
            })?;
        let model_override: Option<Arc<dyn Model>> = match &request.model {
            Some(name) => {
                Some(
                    catalog
                        .model(name)
                        .cloned()
                        .ok_or_else(|| Error::UnknownModel {
                            agent: template.id.clone(),
                            model: name.clone(),
                        })?,
                )
            }
            None => None,
        };
        let tree_id = match &request.tree_id {
            Some(id) => TreeId::from_str(id).map_err(|_| Error::InvalidTreeId(id.clone()))?,
            None => TreeId::generate(),
        };
        let tree_id: Arc<str> = tree_id.as_arc().clone();
        // Started outside any span: a fresh `tree` span is the trace's root.
        let tree_span = if caller.is_none() {
            tracing::info_span!(
                parent: None,
                "tree",
                otel.name = format!("tree {}", template.id).as_str(),
                arbor.tree.id = %tree_id,
            )
        } else {
            caller
        };
        if self.is_running(&tree_id) {
            return Err(Error::TreeExists(tree_id.to_string()));
        }
        // A new tree must not land on a stored one (`resume` continues those).
        if self.store.is_some() && recovery.is_none() {
            let id = tree_id.clone();
            match self
                .read_store(move |store| store.tree(&id).map(drop))
                .await
            {
                Ok(()) => return Err(Error::TreeStored(tree_id.to_string())),
                Err(Error::UnknownTree(_)) => {}
                Err(error) => return Err(error),
            }
        }
        let mut limits = request
            .limits
            .clone()
            .unwrap_or_else(|| self.limits.clone());
        // A request narrows the supervisor's tool policy; it never widens it.
        limits.tools = self.limits.tools.clone().with(&limits.tools);
        // The servers of the tools the tree can reach are up (or known to be
        // down) before its first agent builds a request.
        catalog.prepare_tools(&template.id).await;
        let mut ctx = TreeContext::new(
            tree_id.clone(),
            catalog.clone(),
            limits.clone(),
            self.bus.clone(),
            self.registry.clone(),
            model_override,
        )
        .durable(self.store.is_some())
        .store_health(self.store.as_ref().map(|(_, w)| w.health().clone()));
        if let Some((recovery, replay)) = recovery {
            if !replay {
                self.approvals.asked_before(&tree_id, &recovery.asked);
            }
            ctx = ctx.recovering(recovery, replay);
        }
        // When the tree is gone (every agent and every handle on it), nothing
        // of it stays here: its deadline timer stops and its entry goes (a
        // server that has run a million trees holds what is running, no more).
        let (ended, tree_ended) = oneshot::channel::<()>();
        let trees = Arc::downgrade(&self.trees);
        let id = tree_id.clone();
        let (gone, is_gone) = tokio::sync::watch::channel(false);
        self.gone.locked().insert(tree_id.clone(), is_gone);
        let gone_map = Arc::downgrade(&self.gone);
        let ctx = Arc::new(ctx.on_drop(move || {
            drop(ended);
            let _ = gone.send(true);
            if let Some(map) = gone_map.upgrade() {
                let mut map = map.locked();
                if map.get(&id).is_some_and(|rx| *rx.borrow()) {
                    map.remove(&id);
                }
            }
            if let Some(trees) = trees.upgrade() {
                let mut trees = trees.locked();
                // Not a later tree of the same id (a resume).
                if trees.get(&id).is_some_and(|(t, _)| t.strong_count() == 0) {
                    trees.remove(&id);
                }
            }
        }));
        let toolbox = ctx
            .toolbox(&template)
            .map_err(|_| Error::UnknownAgent(template.id.clone()))?;
        let ids = ctx.root_ids(request.turn);
        let root_run_id = ids.run_id.clone();
        let resumed = ctx
            .recovery()
            .and_then(|r| r.checkpoints.get(&root_run_id).cloned());
        let machine = match resumed {
            Some(checkpoint) => StepMachine::from_checkpoint(
                &checkpoint,
                template.clone(),
                toolbox,
                tree_id.clone(),
            ),
            None => {
                let mut history = request.history.clone().unwrap_or_default();
                let inherited = history.len();
                for message in
                    input_messages(&template, Some(&request.prompt), request.params.as_ref())
                {
                    history.push(message);
                }
                let state = AgentState::initial(Start {
                    ids,
                    agent_type: template.id.clone(),
                    parent: None,
                    history,
                    system_prompt: template.system_prompt.clone(),
                    tool_definitions: toolbox.definitions().clone(),
                    context_token_count: 0,
                    steps_remaining: template.max_steps,
                });
                StepMachine::new(state, template.clone(), toolbox, inherited, tree_id.clone())
                    .with_input(Some(&request.prompt), request.params.as_ref())
            }
        };
        if let Some((_, writer)) = &self.store {
            // Durable before it runs: once `start` returns, the tree can be resumed.
            writer.send(Write::Tree(Box::new(TreeRecord {
                tree_id: tree_id.to_string(),
                root_run_id: root_run_id.clone(),
                agent: template.id.clone(),
                prompt: request.prompt.clone(),
                params: request.params.clone(),
                model: request.model.clone(),
                limits,
                origin: request.origin.clone(),
                config,
                history: request.history.clone(),
                started_ms: crate::tree::now_ms(),
                principal: request.principal.clone(),
            })));
            writer.flush().await?;
        }
        let slot = {
            use arbor_actors::TreeHooks;
            use arbor_actors::hooks::SlotPriority;
            ctx.acquire_slot(SlotPriority {
                depth: 0,
                resume: false,
            })
            .await
        };
        let (tx, rx) = oneshot::channel();
        let hooks: Arc<dyn arbor_actors::TreeHooks> = ctx.clone();
        let (root, root_task) = Actor::spawn(
            None,
            AgentActor,
            AgentArgs {
                hooks,
                machine: Box::new(machine),
                reply: Reply::Root(tx),
                slot,
                parent_span: tree_span,
            },
        )
        .await
        .map_err(|e| Error::Spawn(e.to_string()))?;
        if let Some(deadline) = ctx.budget.limits().deadline {
            let root = root.clone();
            let held = self.deadlines.clone();
            tokio::spawn(async move {
                let _held = held;
                tokio::select! {
                    () = tokio::time::sleep(deadline) => {
                        let limit = LimitHit::new(
                            Limit::Deadline,
                            format!("the tree ran longer than {deadline:?}"),
                        );
                        let _ = root.cast(AgentMsg::Cancel(CancelReason::Limit(limit)));
                    }
                    // The tree is gone: the timer (and the root it holds) with it.
                    _ = tree_ended => {}
                }
            });
        }
        {
            let mut trees = self.trees.locked();
            trees.retain(|_, (t, _)| t.strong_count() > 0);
            trees.insert(tree_id.clone(), (Arc::downgrade(&ctx), root.clone()));
        }
        // A store that failed while the root waited for its slot did not see
        // this tree to fail it; nor did a claim that another process took
        // over meanwhile (the tree is not run here then).
        if let Some(reason) = self.store.as_ref().and_then(|(_, w)| w.failure()) {
            let _ = root.cast(AgentMsg::Cancel(CancelReason::Failed(Failure::new(
                FailureKind::Store,
                reason,
            ))));
        } else if let Some(fenced) = self.store.as_ref().and_then(|(_, w)| w.fenced(&tree_id)) {
            let reason = Error::from(fenced).to_string();
            let _ = root.cast(AgentMsg::Cancel(CancelReason::Failed(Failure::new(
                FailureKind::Store,
                reason,
            ))));
        }
        Ok(TreeHandle {
            tree_id,
            root_run_id,
            root,
            result: rx,
            root_task,
            ctx,
        })
    }

    /// Starts a tree and waits for its root's result.
    pub async fn run(&self, request: StartRequest) -> Result<RunResult, Error> {
        self.start(request).await?.wait().await
    }

    /// The final state of a finished run.
    pub fn finished_state(&self, run_id: &str) -> Option<Arc<AgentState>> {
        self.registry.get(run_id)
    }

    /// The current state of a live run, or the final state of a finished one.
    pub async fn state(&self, run_id: &str) -> Result<AgentState, Error> {
        if let Some(state) = self.live_state(run_id).await {
            return Ok(state);
        }
        self.registry
            .get(run_id)
            .map(|s| (*s).clone())
            .ok_or_else(|| Error::UnknownRun(run_id.to_owned()))
    }

    /// The current state of a run an actor runs now (asked of the actor).
    pub async fn live_state(&self, run_id: &str) -> Option<AgentState> {
        let actor = self.live_actor(run_id)?;
        let snapshot: AgentSnapshot = ractor::call!(actor, AgentMsg::Status).ok()?;
        Some(snapshot.state)
    }

    /// Cancels a run and its whole subtree; its parent sees it as cancelled.
    /// Cancels a running run and its subtree. A child that is spawned but
    /// has not started (it waits for a live slot, or for a retry) ends
    /// cancelled without starting: its parent is told.
    pub fn cancel_run(&self, run_id: &str) -> Result<(), Error> {
        let unknown = || Error::UnknownRun(run_id.to_owned());
        if let Some(actor) = self.live_actor(run_id) {
            return actor
                .cast(AgentMsg::Cancel(CancelReason::Requested))
                .map_err(|_| unknown());
        }
        let parent = self
            .contexts()
            .iter()
            .find_map(|c| {
                let parent = c.waiting_parent(run_id)?;
                c.live_actor(&parent)
            })
            .ok_or_else(unknown)?;
        parent
            .cast(AgentMsg::CancelChild {
                run_id: run_id.to_owned(),
            })
            .map_err(|_| unknown())
    }

    /// Sends a running agent a steering message (semantics §9): it joins
    /// the agent's history at its next step boundary and is journaled as a
    /// `steered` event. Refused for a run that has ended, has not started, or
    /// an empty message, and for one more message than the run may hold
    /// before it takes them ([`Supervisor::with_steer_limits`]);
    /// [`Error::UnknownRun`] for a run this supervisor does not run or keep.
    pub async fn steer(&self, run_id: &str, text: &str) -> Result<(), Error> {
        let refused = |reason| Error::SteerRefused {
            run_id: run_id.to_owned(),
            reason,
        };
        if text.trim().is_empty() {
            return Err(refused(SteerRefused::Empty));
        }
        let Some(actor) = self.live_actor(run_id) else {
            if self.finished_state(run_id).is_some() {
                return Err(refused(SteerRefused::Ended));
            }
            let waiting = self
                .contexts()
                .iter()
                .any(|c| c.waiting_parent(run_id).is_some());
            if waiting {
                return Err(refused(SteerRefused::NotStarted));
            }
            return Err(Error::UnknownRun(run_id.to_owned()));
        };
        let (text, limits): (Arc<str>, _) = (text.into(), self.steer_limits);
        match ractor::call!(actor, |reply| AgentMsg::Steer {
            text,
            limits,
            reply
        }) {
            Ok(answer) => answer.map_err(refused),
            // The actor stopped between the lookup and the call: it ended.
            Err(_) => Err(refused(SteerRefused::Ended)),
        }
    }

    /// Agent actors alive in every tree.
    pub fn live_actors(&self) -> usize {
        self.contexts().iter().map(|c| c.live_count()).sum()
    }

    /// Sets the budgets `set` names and adds `add` to the ones in force, for
    /// the running tree `tree_id` (semantics §13): its agents paused on a
    /// spent budget try their step again. The change is a `limitsRaised`
    /// event, so a resumed tree keeps it. Returns the budgets now in force.
    /// Refused for a raise of nothing ([`Error::NothingRaised`]) or one that
    /// cannot be in force ([`Error::RaiseRefused`], see [`Raised::check_raise`]).
    pub fn raise_limits(&self, tree_id: &str, set: Raised, add: Raised) -> Result<Raised, Error> {
        if set.is_empty() && add.is_empty() {
            return Err(Error::NothingRaised);
        }
        Raised::check_raise(&set, &add)?;
        let ctx = self
            .trees
            .locked()
            .get(tree_id)
            .and_then(|(ctx, _)| ctx.upgrade())
            .ok_or_else(|| Error::UnknownTree(tree_id.to_owned()))?;
        Ok(ctx.raise(set, add)?)
    }

    /// Waits until the tree `tree_id` no longer runs here (at once if it
    /// does not): every agent and every handle of it is gone.
    pub async fn until_ended(&self, tree_id: &str) {
        let rx = self.gone.locked().get(tree_id).cloned();
        if let Some(mut rx) = rx {
            let _ = rx.wait_for(|gone| *gone).await;
        }
    }

    /// Cancels the running tree `tree_id` (its root and so its whole
    /// subtree); `false` when it does not run here.
    pub fn cancel_tree(&self, tree_id: &str) -> bool {
        let root = self
            .trees
            .locked()
            .get(tree_id)
            .filter(|(ctx, _)| ctx.strong_count() > 0)
            .map(|(_, root)| root.clone());
        match root {
            Some(root) => root.cast(AgentMsg::Cancel(CancelReason::Requested)).is_ok(),
            None => false,
        }
    }

    /// Whether another process claimed this tree after this one did (a
    /// higher fencing epoch): the store refused this process's writes for
    /// it from that batch on, so what it emits here since (its stopping
    /// included) is in no journal. False again once this process claims
    /// the tree anew.
    pub fn is_fenced(&self, tree_id: &str) -> bool {
        self.store
            .as_ref()
            .is_some_and(|(_, writer)| writer.fenced(tree_id).is_some())
    }

    /// Whether a tree with this id runs in this supervisor.
    pub fn is_running(&self, tree_id: &str) -> bool {
        self.trees
            .locked()
            .get(tree_id)
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

    fn live_actor(&self, run_id: &str) -> Option<ActorRef<AgentMsg>> {
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
        result.map_err(|_| Error::Lost(self.tree_id.to_string()))
    }
}

/// A fresh tree id: `t` and a UUIDv7's 32 hex digits, time-ordered and
/// unique across processes (`TreeId::generate`). (To subscribe to a tree's
/// events before it starts, pick its id with this and pass it in
/// `StartRequest::tree_id`.)
pub fn new_tree_id() -> String {
    TreeId::generate().into()
}

mod stored;
mod turns;

pub use stored::{BudgetOutcome, CancelOutcome};

pub use turns::{
    DEFAULT_TURN_QUEUE, Multitask, Queued, TurnDecision, TurnRequest, TurnStart, TurnsNow,
    decide_turn,
};

#[cfg(test)]
mod tests;

//! Durable runs: the `Store` port, what is written to it, and the writer that
//! feeds it from the event bus on a thread of its own, in batches, off the
//! agents' path. Only the supervisor side writes; agents never see the store.

// The backend-neutral helpers serve the backends: a build with neither
// (an embedder with its own `Store`) leaves them unused.
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    allow(dead_code, unused_imports)
)]

mod encode;
mod journal;
mod log;
mod owners;
#[cfg(feature = "postgres")]
mod pg;
mod query;
#[cfg(feature = "sqlite")]
mod sqlite;
mod state_row;
mod status;
mod webhook;
mod writer;

use std::sync::Arc;
use std::sync::mpsc;

use arbor_actors::{AgentState, Event, History, Message, RunId, TreeId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Error;
use crate::limits::TreeLimits;
use crate::recovery::Recovery;

pub use journal::{EventType, JournalEntry, UnknownEventType, journal_view};
#[cfg(feature = "sqlite")]
pub(crate) use owners::still_running;
#[cfg(feature = "postgres")]
pub(crate) use owners::{claim_refused, still_running_within};
pub(crate) use owners::{claimable, owner_id, turn_claimable};
#[cfg(feature = "postgres")]
pub use pg::{MigrateReport, PASSWORD_ENV, PgStore, redact_url};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
pub use status::{TreeStatus, UnknownStatus};
pub use webhook::{WebhookClaim, WebhookRecord, WebhookResult, WebhookState};
pub(crate) use webhook::{webhook_claimable, webhook_record};
pub use writer::{DEFAULT_FAIL_AFTER, StoreDown};
pub(crate) use writer::{RESUME_SEQ_GAP, StoreWriter, WriterHealth, WriterHooks};

/// A tree as it was started: enough to start it again (resume, replay).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TreeRecord {
    /// The tree's id.
    pub tree_id: TreeId,
    /// The root's run id (`<tree>/0`).
    pub root_run_id: RunId,
    /// The root's agent type (the template id it started as).
    pub agent: String,
    /// The root's prompt.
    pub prompt: String,
    /// The root's params; `None` when it had none.
    pub params: Option<Value>,
    /// The model every agent of the tree ran on; `None`: each its template's.
    pub model: Option<String>,
    /// The limits the tree runs under: the request's or the supervisor's,
    /// with the supervisor's tool policy added.
    pub limits: TreeLimits,
    /// Where the templates came from (a config file path), if known.
    pub origin: Option<String>,
    /// What the tree started with (see `StartRequest::config`); `None` for a
    /// tree stored before configs were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<Arc<str>>,
    /// The conversation the root started with, before its prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<History>,
    /// When it first started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// The principal that started it (a service's named API caller, see
    /// `StartRequest::principal`): who may see and control it. Set when
    /// the tree is first stored and never changed; `None` for a tree
    /// started without one (a CLI run, an unnamed token) or stored before
    /// principals were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The URL its completion webhook is posted to (see
    /// `StartRequest::webhook`): written with a new tree or a later turn as
    /// the webhook row of its root run (`Store::webhook`), not with the
    /// tree's own; `None` on a record read back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
}

impl TreeRecord {
    /// The request that starts this tree again (resume, replay).
    pub fn request(self) -> Result<crate::StartRequest, crate::Error> {
        Ok(crate::StartRequest {
            agent: self.agent,
            prompt: self.prompt,
            params: self.params,
            limits: Some(self.limits),
            model: self.model,
            tree_id: Some(self.tree_id),
            history: self.history,
            origin: self.origin,
            config: self.config,
            principal: self.principal,
            // Its webhook is on record already (its own row).
            webhook: None,
            started_ms: Some(self.started_ms),
            // The turn its root's run id names (`T/0~n` is turn n).
            turn: self.root_run_id.attempt(),
        })
    }
}

/// One thing to write.
#[derive(Clone, Debug)]
pub enum Write {
    /// A tree started, or was resumed by this process.
    Tree(Box<TreeRecord>),
    /// An event of a tree, in the tree's `seq` order.
    Event(Arc<Event>),
    /// These trees are still being run by this process.
    Heartbeat(Vec<TreeId>),
    /// This process stops running these trees (it is shutting down): they are
    /// marked interrupted at once, for the next process to resume, and nothing
    /// more is written for them.
    Release(Vec<TreeId>),
    /// What a resumed tree's store already holds: messages by their ids, and
    /// the model calls recorded, so neither is written (or counted) again.
    Known {
        /// The resumed tree.
        tree_id: TreeId,
        /// Messages the store holds, each with its id there.
        messages: Vec<(Arc<Message>, u64)>,
        /// The model calls recorded, by run id and step.
        calls: Vec<(String, u32)>,
        /// Every run the log has (each started once already).
        runs: Vec<String>,
    },
}

/// Which trees `Store::trees` lists.
#[derive(Clone, Debug, Default)]
pub struct TreeFilter {
    /// Only trees with this status; `None`: every tree.
    pub status: Option<TreeStatus>,
    /// At most this many trees; 0: no limit.
    pub limit: usize,
    /// Trees skipped first (of those that match, newest first).
    pub offset: usize,
}

/// A tree another process claimed after this one (a higher fencing epoch):
/// nothing of it was written, and this process must stop running it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fenced {
    /// The tree taken over.
    pub tree_id: TreeId,
    /// The epoch this process claimed the tree with.
    pub epoch: u64,
    /// The tree's epoch in the store now (its new owner's claim).
    pub current: u64,
    /// Who holds that claim (`scope:pid`).
    pub owner: String,
}

impl From<Fenced> for Error {
    fn from(f: Fenced) -> Self {
        Error::Fenced {
            tree: f.tree_id,
            epoch: f.epoch,
            current: f.current,
        }
    }
}

/// A tree has not been seen by its process for this long: it was interrupted.
pub const STALE_AFTER_MS: u64 = 5_000;

/// A control message waiting in the store for the process that owns its
/// tree (`Store::post_control`): a body the service defines (cancel,
/// approve, steer, …).
#[derive(Clone, Debug, PartialEq)]
pub struct Control {
    /// Its id, increasing in the order controls were posted.
    pub id: u64,
    /// The tree it is for.
    pub tree_id: TreeId,
    /// What it says.
    pub body: Value,
}

/// A follow-up turn waiting in the store for its tree's running turn to
/// end (`Store::queue_turn`, semantics §14): whichever process runs the
/// tree then (or finds it ended) starts it, as run `T/0~turn`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedTurn {
    /// Its id in the store, increasing in the order turns were queued.
    pub id: u64,
    /// The tree it is a turn of.
    pub tree_id: TreeId,
    /// Its turn number: its root will be run `T/0~turn`.
    pub turn: u32,
    /// The turn's prompt.
    pub prompt: String,
    /// The turn's params; `None` when it has none.
    pub params: Option<Value>,
    /// When it was queued, in milliseconds since the Unix epoch.
    pub queued_ms: u64,
    /// Its place in the tree's queue when it was read: 1 is the next turn.
    pub position: usize,
    /// Where its run's completion webhook is posted, once it has started
    /// (written with the turn's record then); `None`: it asked for none.
    pub webhook: Option<String>,
}

impl QueuedTurn {
    /// The run id its root will have: `T/0~turn`.
    pub fn run_id(&self) -> RunId {
        self.tree_id.root().retry(self.turn)
    }
}

/// The turn a tree's latest root run id names (`T/0` is 0, `T/0~n` is n).
pub(crate) fn turn_of(root_run_id: &str) -> u32 {
    root_run_id
        .parse::<arbor_actors::RunId>()
        .map_or(0, |id| id.attempt())
}

/// Who runs a tree now (`Store::owner`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The owner's id (`scope:pid`).
    pub owner: String,
    /// Its last heartbeat, in milliseconds since the Unix epoch.
    pub heartbeat_ms: u64,
    /// The epoch of its claim.
    pub epoch: u64,
}

/// A wake-up for a process that follows trees in a shared store
/// (`Store::subscribe`): something was committed, read it now instead of at
/// the next poll. Wake-ups may be lost (a dropped connection), so a follower
/// still polls, less often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wake {
    /// A batch with events of this tree committed; `seq` is the last one.
    Journal {
        /// The tree.
        tree_id: String,
        /// Its last `seq` written.
        seq: u64,
    },
    /// A control was posted for this tree.
    Control {
        /// The tree.
        tree_id: String,
    },
    /// A process released its trees (a graceful shutdown): they are
    /// interrupted now, to adopt at once rather than at the next poll.
    Released {
        /// How many it released.
        trees: u64,
    },
}

/// A tree's row as a store keeps it, every column: what `Store::load` puts
/// back unchanged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TreeRow {
    /// The tree's id.
    pub tree_id: String,
    /// Its current root run id.
    pub root_run_id: String,
    /// The root's agent type.
    pub agent: String,
    /// The root's prompt.
    pub prompt: String,
    /// The params, as JSON text.
    pub params: Option<String>,
    /// The model override.
    pub model: Option<String>,
    /// The limits, as JSON text.
    pub limits: String,
    /// Where the templates came from.
    pub origin: Option<String>,
    /// The initial history, as JSON text.
    pub history: Option<String>,
    /// The status as stored (`running` or a final one).
    pub status: TreeStatus,
    /// The root's error.
    pub error: Option<String>,
    /// When it started.
    pub started_ms: u64,
    /// When its root ended.
    pub finished_ms: Option<u64>,
    /// Its owner's last heartbeat.
    pub heartbeat_ms: u64,
    /// Its owner.
    pub owner: String,
    /// The last `seq` written.
    pub last_seq: u64,
    /// The next record id of its log.
    pub next_id: u64,
    /// Segments in its log.
    pub segments: u64,
    /// Times it was resumed.
    pub resumes: u64,
    /// Runs started.
    pub agents: u64,
    /// Input tokens spent.
    pub input_tokens: u64,
    /// Output tokens spent.
    pub output_tokens: u64,
    /// Credits spent.
    pub cost: f64,
    /// The epoch of its last claim.
    pub epoch: u64,
    /// The principal that started it (absent in a dump made before
    /// principals were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

/// One segment of a tree's log, as stored (LZ4-compressed JSON records).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Its number in the log, from 1.
    pub n: u64,
    /// Its bytes.
    pub body: Vec<u8>,
}

/// A tree with its whole log (`Store::dump`): moved into another store with
/// `Store::load`, it is the same tree there (same segments, ids, epochs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TreeDump {
    /// Its row.
    pub row: TreeRow,
    /// The config it started with, if stored.
    pub config: Option<String>,
    /// Its log, in order.
    pub segments: Vec<Segment>,
}

/// The error of a dump's tree that the store has already
/// ([`Error::TreeStored`]); a dump whose tree id is no tree id says so.
pub(crate) fn already_stored(tree_id: &str) -> Error {
    match tree_id.parse::<TreeId>() {
        Ok(tree) => Error::TreeStored(tree),
        Err(_) => Error::InvalidTreeId(tree_id.to_owned()),
    }
}

/// Tree ids as the store keeps them (text), typed; one that is no tree id
/// is the store's corruption, named.
pub(crate) fn tree_ids(ids: Vec<String>) -> Result<Vec<TreeId>, Error> {
    ids.into_iter()
        .map(|id| {
            id.parse::<TreeId>()
                .map_err(|e| Error::Store(format!("a stored tree id {id:?} is no tree id: {e}")))
        })
        .collect()
}

/// A run id as the store keeps it (text), typed; one that is no run id is
/// the store's corruption, named.
pub(crate) fn run_id(id: &str) -> Result<RunId, Error> {
    id.parse::<RunId>()
        .map_err(|e| Error::Store(format!("a stored run id {id:?} is no run id: {e}")))
}

/// Copies the tree `tree_id` with its whole log from one store to another
/// (of either backend), unchanged, and the turns queued for it (same turn
/// numbers and order; queued again, so their wait starts anew); refused if
/// `to` has a tree of that id.
pub fn copy_tree(from: &dyn Store, to: &dyn Store, tree_id: &TreeId) -> Result<(), Error> {
    let dump = from.dump(tree_id)?;
    let queued = from.queued_turns(tree_id)?;
    to.load(&dump)?;
    for turn in &queued {
        to.queue_turn(
            tree_id,
            &turn.prompt,
            turn.params.as_ref(),
            turn.webhook.as_deref(),
            usize::MAX,
        )?;
    }
    Ok(())
}

/// A tree as `arbor runs` lists it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TreeSummary {
    /// The tree's id.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub tree_id: TreeId,
    /// The root's run id.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub root_run_id: RunId,
    /// The root's agent type.
    pub agent: String,
    /// The root's prompt.
    pub prompt: String,
    /// Where the tree is: `interrupted` is judged when it is read (stored as
    /// running, its owner gone).
    pub status: TreeStatus,
    /// What went wrong, when the root ended with an error (why it failed, or
    /// the error message its output carries); `None` otherwise.
    pub error: Option<String>,
    /// Runs that have started, each once (a resumed tree's runs that go on
    /// are not counted again), so a running or interrupted tree shows them.
    pub agents: u64,
    /// Input tokens of every model call of the tree.
    pub input_tokens: u64,
    /// Output tokens of every model call of the tree.
    pub output_tokens: u64,
    /// Credits every model call of the tree cost.
    pub cost: f64,
    /// When it first started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// When its root ended, in milliseconds since the Unix epoch; `None`
    /// while it runs or is interrupted.
    pub finished_ms: Option<u64>,
    /// How many times it was resumed (after a crash, a restart, a
    /// takeover); a follow-up turn is not a resume.
    pub resumes: u64,
    /// The principal that started it (see `TreeRecord::principal`);
    /// absent when none did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

/// One run of a tree, with what it spent.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunNode {
    /// The run's id.
    pub run_id: String,
    /// The run that spawned it; `None` for the root.
    pub parent_run_id: Option<String>,
    /// Its agent type (template id).
    pub agent_type: String,
    /// How far below the root it is (the root is 0).
    pub depth: u64,
    /// `running`, or its final status (`completed`, `failed`, `cancelled`).
    pub status: String,
    /// The error its final event names; `None` otherwise.
    pub error: Option<String>,
    /// The kind of that error (`model_rate_limited`, `limit`, …; semantics
    /// §7); `None` when it did not fail or was stored before kinds were.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub error_kind: Option<arbor_actors::FailureKind>,
    /// Model replies recorded for it (one per model step).
    pub steps: u64,
    /// Input tokens of its own model calls.
    pub input_tokens: u64,
    /// Output tokens of its own model calls.
    pub output_tokens: u64,
    /// Credits its own model calls cost.
    pub cost: f64,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// When it ended, in milliseconds since the Unix epoch; `None` while it
    /// has not.
    pub finished_ms: Option<u64>,
}

/// A run's state as stored: final, or its last checkpoint.
#[derive(Clone, Debug)]
pub struct StoredRun {
    /// The run and what it spent.
    pub node: RunNode,
    /// Its final state, or else its last checkpoint's; `None` when neither
    /// was stored (it had not reached its first checkpoint).
    pub state: Option<AgentState>,
    /// Whether `state` is the final one.
    pub is_final: bool,
    /// Messages at the start of the state's history the run inherited (its
    /// output value leaves them out).
    pub inherited: usize,
}

/// What `Store::gc` removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    /// Trees removed.
    pub trees: u64,
    /// Log segments removed with them.
    pub segments: u64,
}

/// Where runs are kept. The embedded default is `SqliteStore`.
pub trait Store: Send + Sync + 'static {
    /// Writes a batch in one transaction: all of it, or nothing. Trees this
    /// store claimed (`Write::Tree`, `claim`) are fenced: when another
    /// process has claimed one since (a higher epoch), none of the batch's
    /// writes for it are applied, and it is returned, the rest is written.
    fn write(&self, batch: &[Write]) -> Result<Vec<Fenced>, Error>;
    /// Trees, newest first.
    fn trees(&self, filter: &TreeFilter) -> Result<Vec<TreeSummary>, Error>;
    /// The trees `principal` started, as `trees` lists them (the filter,
    /// limit and offset count only those). The default reads every tree;
    /// both backends select them in their query.
    fn trees_of(&self, filter: &TreeFilter, principal: &str) -> Result<Vec<TreeSummary>, Error> {
        let all = TreeFilter {
            limit: 0,
            offset: 0,
            ..filter.clone()
        };
        let limit = if filter.limit == 0 {
            usize::MAX
        } else {
            filter.limit
        };
        Ok(self
            .trees(&all)?
            .into_iter()
            .filter(|t| t.principal.as_deref() == Some(principal))
            .skip(filter.offset)
            .take(limit)
            .collect())
    }
    /// The principal that started the tree (`None`: none did), read from
    /// the store, so every replica answers the same; `Error::UnknownTree`
    /// if the store has no such tree.
    fn principal(&self, tree_id: &TreeId) -> Result<Option<String>, Error> {
        Ok(self.tree(tree_id)?.0.principal)
    }
    /// A tree as it was started and as it is listed; `Error::UnknownTree` if
    /// the store has none with this id.
    fn tree(&self, tree_id: &TreeId) -> Result<(TreeRecord, TreeSummary), Error>;
    /// Every run of a tree, in the order they started.
    fn runs(&self, tree_id: &TreeId) -> Result<Vec<RunNode>, Error>;
    /// One run, with its final state or last checkpoint; `Error::UnknownRun`
    /// if the store has none with this id.
    fn run(&self, run_id: &RunId) -> Result<StoredRun, Error>;
    /// What a resume (or, with its replies, a replay) of the tree starts from.
    fn recovery(&self, tree_id: &TreeId) -> Result<Recovery, Error>;
    /// The final states of every finished run, in the order they finished.
    fn final_states(&self, tree_id: &TreeId) -> Result<Vec<AgentState>, Error>;
    /// A tree's journaled events with `seq` above `after`, in order, each as
    /// `journal_view` gives the live event (as emitted, without the states and
    /// replies stored elsewhere, and without streaming deltas and checkpoints).
    fn events(&self, tree_id: &TreeId, after: u64) -> Result<Vec<JournalEntry>, Error>;
    /// Everything stored of a tree, as one JSON document.
    fn export(&self, tree_id: &TreeId) -> Result<Value, Error>;
    /// Removes trees that ended before `cutoff_ms`, and what only they used.
    fn gc(&self, cutoff_ms: u64) -> Result<GcReport, Error>;
    /// Takes an interrupted tree over for this process, atomically (of two
    /// processes resuming one tree, one gets it): fails if it has ended or
    /// another live process runs it. Returns the claim's fencing epoch (one
    /// more than the last claim's): writes for the tree hold to it, and stop
    /// applying once another process claims the tree after this one.
    fn claim(&self, tree_id: &TreeId) -> Result<u64, Error>;

    /// Claims, as `claim` would each, those of `tree_ids` that are
    /// interrupted, for this process: the trees claimed with their epochs,
    /// in the order given. One that has ended, that a live process runs,
    /// that the store does not have, or (Postgres) that another process is
    /// claiming at this very moment is left out, not an error: replicas
    /// adopting at once split the trees between them. Postgres claims them
    /// all in one transaction (`FOR UPDATE SKIP LOCKED`, one `UPDATE`).
    fn claim_interrupted(&self, tree_ids: &[TreeId]) -> Result<Vec<(TreeId, u64)>, Error> {
        let mut claimed = Vec::new();
        for tree_id in tree_ids {
            match self.claim(tree_id) {
                Ok(epoch) => claimed.push((tree_id.clone(), epoch)),
                Err(Error::NotResumable { .. } | Error::UnknownTree(_)) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(claimed)
    }

    /// What a resume of each of `tree_ids` starts from, in the order given:
    /// its record (`tree`) and its `recovery`, or why it cannot be read
    /// (`Error::UnknownTree`, a corrupt log); the outer error is the
    /// store's (no answer at all). Postgres reads them all in two queries.
    #[allow(clippy::type_complexity)]
    fn resumes(
        &self,
        tree_ids: &[TreeId],
    ) -> Result<Vec<Result<(TreeRecord, Recovery), Error>>, Error> {
        Ok(tree_ids
            .iter()
            .map(|id| Ok((self.tree(id)?.0, self.recovery(id)?)))
            .collect())
    }

    /// The tree's status as `trees` lists it (`interrupted` judged now),
    /// without reading its record; `Error::UnknownTree` if there is none.
    fn status(&self, tree_id: &TreeId) -> Result<TreeStatus, Error> {
        Ok(self.tree(tree_id)?.1.status)
    }

    /// Claims an ended tree for a follow-up turn (semantics §14): it is
    /// running again, owned by this process, under the next epoch. Refused
    /// for a tree that is running (here or elsewhere) or was cut short.
    fn claim_turn(&self, tree_id: &TreeId) -> Result<u64, Error>;

    /// Ends a tree this process claimed (at `epoch`) but cannot load (its
    /// log is damaged, its config cannot be built): `failed`, with
    /// `reason`, so that it is not listed running for ever nor claimed
    /// again and again. Nothing changes if another process claimed it since.
    fn fail_claimed(&self, tree_id: &TreeId, epoch: u64, reason: &str) -> Result<(), Error>;

    /// Ends a tree this process claimed (at `epoch`) as `cancelled`, with
    /// `reason`: a person cancelled it while nobody ran it (`arbor cancel`),
    /// so no process resumes or adopts it. Nothing changes if another
    /// process claimed it since.
    fn cancel_claimed(&self, tree_id: &TreeId, epoch: u64, reason: &str) -> Result<(), Error>;

    /// Stores a control message for whichever process owns the tree (it
    /// takes it with `take_controls`); returns its id. `Error::UnknownTree`
    /// if the store has no such tree.
    fn post_control(&self, tree_id: &TreeId, control: &Value) -> Result<u64, Error>;

    /// Takes the controls waiting for these trees (the ones the caller
    /// runs), oldest first, atomically: each is taken once, by one caller.
    fn take_controls(&self, tree_ids: &[TreeId]) -> Result<Vec<Control>, Error>;

    /// Queues a follow-up turn of the tree for when its running turn ends
    /// (semantics §14), durably: its turn number is one past the tree's
    /// latest turn, started or queued, and its place is after every turn
    /// waiting already. `Error::UnknownTree` if the store has no such tree;
    /// `Error::TurnQueueFull` when `limit` turns wait for it already.
    fn queue_turn(
        &self,
        tree_id: &TreeId,
        prompt: &str,
        params: Option<&Value>,
        webhook: Option<&str>,
        limit: usize,
    ) -> Result<QueuedTurn, Error>;

    /// The turns waiting for the tree, next first (those not started yet).
    fn queued_turns(&self, tree_id: &TreeId) -> Result<Vec<QueuedTurn>, Error>;

    /// Claims the tree for the next turn waiting for it, as `claim_turn`
    /// does (running again, owned by this process, under the next epoch),
    /// in the transaction that reads it: of two processes taking a tree's
    /// next turn, one gets it. `None` (nothing claimed) when the tree's turn
    /// has not ended (it runs, here or elsewhere, or was cut short), when no
    /// turn waits, or when `only` names a turn that is not the next. The
    /// turn stays on record until its root is stored as the tree's latest
    /// (`Write::Tree`), so a process that dies before it starts leaves it
    /// for the next.
    fn take_turn(
        &self,
        tree_id: &TreeId,
        only: Option<u64>,
    ) -> Result<Option<(QueuedTurn, u64)>, Error>;

    /// Removes a queued turn that cannot start (its input no longer fits,
    /// its tree cannot go on); nothing if it is gone already.
    fn forget_turn(&self, id: u64) -> Result<(), Error>;

    /// Trees whose turn has ended that have turns waiting, at most `limit`
    /// of them: a process that found none running takes them (`take_turn`).
    fn trees_with_queued_turns(&self, limit: usize) -> Result<Vec<TreeId>, Error>;

    /// Who runs the tree now: `None` if it is not running (ended, or
    /// interrupted: its owner is gone or its lease ran out).
    /// `Error::UnknownTree` if the store has no such tree.
    fn owner(&self, tree_id: &TreeId) -> Result<Option<Owner>, Error>;

    /// Wake-ups when other processes commit (see `Wake`); `None` when the
    /// backend has none (SQLite: followers poll).
    fn subscribe(&self) -> Result<Option<mpsc::Receiver<Wake>>, Error> {
        Ok(None)
    }

    /// How long a tree whose owner cannot be seen counts as running after
    /// its last heartbeat.
    fn lease_ms(&self) -> u64 {
        STALE_AFTER_MS
    }

    /// The completion webhook of the root run `run_id` (a tree's first
    /// run, or a later turn's); `None` when it asked for none. The default
    /// (a store without webhooks) has none.
    fn webhook(&self, run_id: &RunId) -> Result<Option<WebhookRecord>, Error> {
        let _ = run_id;
        Ok(None)
    }

    /// Runs whose webhook could be claimed now (`webhook_claimable`: the
    /// run ended, an attempt is due, nobody holds it), at most `limit`.
    fn webhooks_due(&self, now_ms: u64, limit: usize) -> Result<Vec<RunId>, Error> {
        let _ = (now_ms, limit);
        Ok(Vec::new())
    }

    /// Claims the run's webhook for one attempt by this process, held
    /// until `hold_until_ms` (the attempt's end at the latest), atomically:
    /// of two processes claiming it, one gets it. `None` when it cannot be
    /// claimed now (delivered or given up on, not due, its run running,
    /// held by another process) or there is none.
    fn claim_webhook(
        &self,
        run_id: &RunId,
        now_ms: u64,
        hold_until_ms: u64,
    ) -> Result<Option<WebhookClaim>, Error> {
        let _ = (run_id, now_ms, hold_until_ms);
        Ok(None)
    }

    /// Records what the attempt of `claim` came to, and lets go of the
    /// webhook: `false` (nothing written) when another process has claimed
    /// it since (its claim is fenced).
    fn webhook_attempted(
        &self,
        claim: &WebhookClaim,
        result: &WebhookResult,
        now_ms: u64,
    ) -> Result<bool, Error> {
        let _ = (claim, result, now_ms);
        Ok(false)
    }

    /// A tree with its whole log, as stored.
    fn dump(&self, tree_id: &TreeId) -> Result<TreeDump, Error>;

    /// Puts a dumped tree in, unchanged, in one transaction;
    /// `Error::TreeStored` if the store has a tree of that id.
    fn load(&self, dump: &TreeDump) -> Result<(), Error>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::{TreeStatus, claimable, owner_id, turn_claimable};
    use crate::error::Error;

    fn reason(result: Result<(), Error>) -> String {
        match result {
            Err(Error::NotResumable { tree, reason }) => {
                assert_eq!(tree, "t");
                reason
            }
            other => panic!("not a refusal: {other:?}"),
        }
    }

    /// The claim decisions both backends take: an ended tree, a tree its
    /// (living) owner runs, and one whose unseen owner's heartbeat is within
    /// the lease cannot be resumed; an unseen owner's past the lease can; a
    /// follow-up turn needs the last one ended.
    #[test]
    fn a_tree_is_claimable_once_nobody_runs_it_and_a_turn_once_the_last_ended() {
        let unseen = "elsewhere:1";
        let running = TreeStatus::Running;
        let t: arbor_actors::TreeId = "t".parse().unwrap();
        let t = &t;
        let ended = reason(claimable(t, (TreeStatus::Completed, unseen, 0), 10, 5));
        assert!(ended.starts_with("it already ended"), "{ended}");
        let alive = reason(claimable(t, (running, &owner_id(), 0), 1_000_000, 5));
        assert!(
            alive.starts_with("another process is running it"),
            "{alive}"
        );
        assert!(claimable(t, (running, unseen, 100), 105, 5).is_err());
        assert!(claimable(t, (running, unseen, 100), 106, 5).is_ok());
        let turn = reason(turn_claimable(t, running));
        assert_eq!(turn, "its turn has not ended (running)");
        assert!(turn_claimable(t, TreeStatus::Completed).is_ok());
    }
}

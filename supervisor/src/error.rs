//! The supervisor's error type.

use std::path::PathBuf;

/// Any error, as a [`CatalogResolver`](crate::CatalogResolver) gives it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What can go wrong when starting or querying a tree.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A stored tree's config cannot be built into a catalog here.
    #[error("the config the tree started with: {0}")]
    TreeConfig(BoxError),
    /// No template of the catalog matches the requested agent type (named
    /// here as it was asked for).
    #[error("agent type {0} not found")]
    UnknownAgent(String),
    /// A template's model, or the model a start request asks for, is not in
    /// the catalog.
    #[error("model {model} (used by agent {agent}) is not configured")]
    UnknownModel {
        /// The template's id.
        agent: String,
        /// The model name that is not configured.
        model: String,
    },
    /// A template cannot be built: a spawnable agent that is not defined, or
    /// a toolbox that does not build (an unknown tool, a bad schema).
    #[error("agent {agent}: {message}")]
    InvalidTemplate {
        /// The template's id.
        agent: String,
        /// What is wrong with it.
        message: String,
    },
    /// A start request's prompt or params do not fit the template's input
    /// (params must be a JSON object that passes its schema). The message
    /// names the agent and whether the prompt or the params failed.
    #[error("{message}")]
    InvalidInput {
        /// The id of the template the input was checked against.
        agent: String,
        /// What failed, as shown to the user.
        message: String,
    },
    /// A request asks for something no tree may have: a limit out of its
    /// range or looser than the supervisor's, a tool pattern that is not one
    /// ([`crate::request`]). Named by the request's own spelling of the field
    /// (`limits.maxSteps`, `tools.deny`), the same from the library, the CLI
    /// and HTTP.
    #[error("{field}: {problem}")]
    InvalidRequest {
        /// The field, as a request spells it (`limits.maxSteps`).
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The root agent's actor could not be started (the actor system's reason).
    #[error("could not start the root agent: {0}")]
    Spawn(String),
    /// The root of this tree stopped without sending its result.
    #[error("the root agent of tree {0} ended without a result")]
    Lost(arbor_actors::TreeId),
    /// No run has this id where it was looked up (the live trees, the
    /// finished states this supervisor keeps, or the store).
    #[error("no run {0}")]
    UnknownRun(arbor_actors::RunId),
    /// A request to raise a tree's budgets named none of them.
    #[error("raise at least one of maxSteps, maxTokens, maxCredits")]
    NothingRaised,
    /// A raise of a tree's budgets that cannot be in force: a step or token
    /// budget of 0, or a credit amount that is negative or not finite.
    #[error(transparent)]
    RaiseRefused(#[from] crate::limits::RaiseRefused),
    /// No tool call of that id waits for a decision in that tree.
    #[error("no tool call {call_id} of tree {tree_id} waits for a decision")]
    UnknownApproval {
        /// The tree.
        tree_id: arbor_actors::TreeId,
        /// The call id.
        call_id: String,
    },
    /// A decision on a waiting tool call was refused (semantics §12).
    #[error("the decision on tool call {call_id} of tree {tree_id} was refused: {reason}")]
    DecisionRefused {
        /// The tree.
        tree_id: arbor_actors::TreeId,
        /// The call id.
        call_id: String,
        /// Why.
        reason: arbor_actors::approval::DecideRefused,
    },
    /// A steering message was refused (semantics §9).
    #[error("run {run_id} refused the message: {reason}")]
    SteerRefused {
        /// The run it was for.
        run_id: arbor_actors::RunId,
        /// Why.
        reason: arbor_actors::steer::SteerRefused,
    },
    /// A tree with this id is running in this supervisor.
    #[error("a tree with id {0} is still running (tree ids must be unique)")]
    TreeExists(arbor_actors::TreeId),
    /// A start request's tree id is not a valid one.
    #[error("tree id {0:?} is not valid: use 1 to 128 letters, digits, '-', '_', '.' or ':'")]
    InvalidTreeId(String),
    /// A new tree would take the id of a tree the store has (resume continues
    /// that one).
    #[error(
        "the store already has a tree {0} (resume it with `arbor resume {0}`, or choose another id)"
    )]
    TreeStored(arbor_actors::TreeId),
    /// The store has no tree with this id.
    #[error("no tree {0} in the store")]
    UnknownTree(arbor_actors::TreeId),
    /// A tree or run was named by a text that is no id of one (so nothing
    /// has it): said as [`Error::UnknownTree`] and [`Error::UnknownRun`]
    /// say it, with the text as given.
    #[error(
        "{}",
        match .0 {
            arbor_actors::IdError::Tree(text) => format!("no tree {text} in the store"),
            arbor_actors::IdError::Run(text) => format!("no run {text}"),
        }
    )]
    NoSuchId(arbor_actors::IdError),
    /// The store's file cannot be opened or made ready: there is none, it
    /// is busy, damaged or empty, or a migration failed (the reason says).
    #[error("cannot open store {path}: {reason}")]
    StoreOpen {
        /// The store's file.
        path: String,
        /// Why it cannot be opened.
        reason: String,
        /// Another process held the file's lock (opening is tried again
        /// until the busy timeout; a caller may try again later).
        busy: bool,
    },
    /// The file is not an Arbor store: not SQLite, or another application's.
    #[error(
        "{path} is not an Arbor store (it is not a SQLite file, or belongs to another program)"
    )]
    NotAStore {
        /// The file.
        path: String,
    },
    /// The store's schema is newer than this build knows; nothing was
    /// written to it.
    #[error(
        "store {path} was written by a newer Arbor (schema version {found}; this build knows up to {known}): upgrade arbor to use it"
    )]
    NewerStore {
        /// The store's file.
        path: String,
        /// The file's schema version.
        found: i64,
        /// The newest schema version this build knows.
        known: i64,
    },
    /// The supervisor has no store, and the call needs one (`read_store`,
    /// `resume`).
    #[error(
        "{}",
        match .needed_for {
            StoreUse::Resume => "resume needs a store",
            StoreUse::Turn => "a follow-up turn needs a store (it continues the stored tree)",
            StoreUse::Read => "this supervisor has no store",
        }
    )]
    NoStore {
        /// What the call needed the store for (the message says so).
        needed_for: StoreUse,
    },
    /// A replay was asked of a supervisor with a store (a replay must never
    /// overwrite what it is checked against).
    #[error("a replay runs on a supervisor without a store")]
    ReplayWithStore,
    /// A read or write of the store's file failed (SQL or I/O).
    #[error("{}: {source}", path.display())]
    StoreIo {
        /// The store's file.
        path: PathBuf,
        /// The SQL or I/O error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A batch could not be written (after retrying while the file was busy).
    #[error("cannot write {}: {source}", path.display())]
    StoreWrite {
        /// The store's file.
        path: PathBuf,
        /// The error of the last attempt.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The store cannot take writes now, and may later: its connection was
    /// lost (a database restart, a terminated backend, a network fault) or
    /// its disk is full. The writer keeps the batch and tries it again with
    /// backoff; until then no tree starts, and a process sharing the store
    /// claims nothing.
    #[error(
        "{}",
        if *disk_full {
            format!("the store's disk is full at {path}: {reason}")
        } else {
            format!("the store at {path} cannot be reached: {reason}")
        }
    )]
    StoreUnavailable {
        /// The store (a file, or a URL without its password).
        path: String,
        /// What the store or the system said.
        reason: String,
        /// Whether the disk under it is full (freeing space brings it back).
        disk_full: bool,
    },
    /// A stored tree's records are not what this build can read.
    #[error("{path}: tree {tree}: {reason}")]
    StoreCorrupt {
        /// The store's file.
        path: String,
        /// The tree whose records these are.
        tree: arbor_actors::TreeId,
        /// What could not be read.
        reason: String,
    },
    /// A stored row names its tree by a text that is no tree id (said as
    /// [`Error::StoreCorrupt`] says it, with the text as stored).
    #[error("{path}: tree {text}: {reason}")]
    StoreCorruptId {
        /// The store's file.
        path: String,
        /// The row's tree id, as stored.
        text: String,
        /// What could not be read (the id's problem among it).
        reason: String,
    },
    /// A lock of the store was poisoned by a panic while a write held it
    /// (the data it guards may be half-written, so the store refuses).
    #[error("{0}")]
    StorePoisoned(&'static str),
    /// The store stopped taking writes (a write failed, its writer panicked
    /// or stopped) or a store task failed: the reason says which. No new
    /// tree starts on this supervisor's store after a write failed.
    #[error("{0}")]
    Store(String),
    /// A stored tree cannot be claimed for a resume: it has ended, or
    /// another live process runs it.
    #[error("tree {tree} cannot be resumed: {reason}")]
    NotResumable {
        /// The tree's id.
        tree: arbor_actors::TreeId,
        /// Why not.
        reason: String,
    },
    /// Another process claimed the tree after this one (its fencing epoch is
    /// higher): this process stops running it and writes nothing more of it.
    #[error(
        "tree {tree} was taken over by another process (claim epoch {current}; this process \
         held {epoch}): it stopped here and goes on there"
    )]
    Fenced {
        /// The tree's id.
        tree: arbor_actors::TreeId,
        /// The fencing epoch this process claimed the tree with.
        epoch: u64,
        /// The tree's epoch in the store now (the other process's claim).
        current: u64,
    },
    /// A follow-up turn asked for with `multitask = reject` while the tree
    /// runs a turn (semantics §14).
    #[error("tree {tree} is running a turn (multitask = reject)")]
    TurnRunning {
        /// The tree's id.
        tree: arbor_actors::TreeId,
    },
    /// A follow-up turn that would wait behind as many queued turns of its
    /// tree as it may hold (`Supervisor::with_turn_queue_limit`).
    #[error("tree {tree} has {limit} turns queued already, the most it holds")]
    TurnQueueFull {
        /// The tree's id.
        tree: arbor_actors::TreeId,
        /// How many turns a tree may have waiting.
        limit: usize,
    },
    /// A cancel that cannot be carried out (`Supervisor::cancel_stored`):
    /// its tree has ended, or a part of a tree nobody runs was named.
    #[error("cannot cancel {id}: {reason}")]
    CancelRefused {
        /// The tree or run named, as `Target` shows it (the text keeps this
        /// module free of the supervisor's).
        id: String,
        /// Why.
        reason: String,
    },
    /// A raise of the budgets of a tree that has ended
    /// (`Supervisor::raise_stored`): only a running tree's are raised.
    #[error(
        "tree {tree} has ended ({status}): only a running tree's budgets are raised (arbor run --continue {tree} gives it a new turn)"
    )]
    RaiseEnded {
        /// The tree.
        tree: arbor_actors::TreeId,
        /// How it ended.
        status: crate::store::TreeStatus,
    },
}

impl Error {
    /// Whether trying the same thing again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Spawn(_) | Error::StoreUnavailable { .. })
    }
}

/// What a call needed the store for, when the supervisor has none ([`Error::NoStore`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreUse {
    /// Reading it (`Supervisor::read_store`).
    Read,
    /// Resuming a stored tree (`Supervisor::resume`).
    Resume,
    /// A follow-up turn of a stored tree (`Supervisor::start_turn`).
    Turn,
}

#[cfg(test)]
mod tests {
    use arbor_actors::{IdError, RunId, TreeId};

    use super::Error;

    /// The ids in errors are typed (issue 35), and the messages are the ones
    /// the CLI and HTTP bodies always said: a text that is no id reads as a
    /// tree or run nobody has, in the same words.
    #[test]
    fn typed_ids_in_errors_say_what_the_text_ids_said() {
        let tree: TreeId = "t1".parse().unwrap();
        let run: RunId = "t1/0.2".parse().unwrap();
        assert_eq!(
            Error::UnknownTree(tree.clone()).to_string(),
            "no tree t1 in the store"
        );
        assert_eq!(Error::UnknownRun(run).to_string(), "no run t1/0.2");
        assert_eq!(
            Error::TreeExists(tree.clone()).to_string(),
            "a tree with id t1 is still running (tree ids must be unique)"
        );
        assert_eq!(
            Error::TreeStored(tree.clone()).to_string(),
            "the store already has a tree t1 (resume it with `arbor resume t1`, or choose another id)"
        );
        assert_eq!(
            Error::TurnRunning { tree: tree.clone() }.to_string(),
            "tree t1 is running a turn (multitask = reject)"
        );
        assert_eq!(
            Error::NoSuchId(IdError::Tree("no such!".into())).to_string(),
            "no tree no such! in the store"
        );
        assert_eq!(
            Error::NoSuchId(IdError::Run("t1/x".into())).to_string(),
            "no run t1/x"
        );
        assert_eq!(
            Error::Fenced {
                tree: tree.clone(),
                epoch: 1,
                current: 2
            }
            .to_string(),
            "tree t1 was taken over by another process (claim epoch 2; this process held 1): \
             it stopped here and goes on there"
        );
        assert_eq!(
            Error::StoreCorrupt {
                path: "s.db".into(),
                tree,
                reason: "a segment is corrupt".into()
            }
            .to_string(),
            "s.db: tree t1: a segment is corrupt"
        );
        assert_eq!(
            Error::StoreCorruptId {
                path: "s.db".into(),
                text: "no such!".into(),
                reason: "a control's tree id: bad".into()
            }
            .to_string(),
            "s.db: tree no such!: a control's tree id: bad"
        );
    }
}

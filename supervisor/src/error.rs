//! The supervisor's error type.

use std::path::PathBuf;

/// What can go wrong when starting or querying a tree.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A stored tree's config cannot be built into a catalog here.
    #[error("the config the tree started with: {0}")]
    TreeConfig(String),
    #[error("agent type {0} not found")]
    UnknownAgent(String),
    #[error("model {model} (used by agent {agent}) is not configured")]
    UnknownModel { agent: String, model: String },
    #[error("agent {agent}: {message}")]
    InvalidTemplate { agent: String, message: String },
    /// The message names the agent and whether the prompt or the params failed.
    #[error("{message}")]
    InvalidInput { agent: String, message: String },
    #[error("could not start the root agent: {0}")]
    Spawn(String),
    #[error("the root agent of tree {0} ended without a result")]
    Lost(String),
    #[error("no run {0}")]
    UnknownRun(String),
    #[error("a tree with id {0} is still running (tree ids must be unique)")]
    TreeExists(String),
    #[error("tree id {0:?} is not valid: use 1 to 128 letters, digits, '-', '_', '.' or ':'")]
    InvalidTreeId(String),
    #[error(
        "the store already has a tree {0} (resume it with `arbor resume {0}`, or choose another id)"
    )]
    TreeStored(String),
    #[error("no tree {0} in the store")]
    UnknownTree(String),
    #[error("cannot open store {path}: {reason}")]
    StoreOpen {
        path: String,
        reason: String,
        /// Another process held the file's lock (opening is tried again
        /// until the busy timeout; a caller may try again later).
        busy: bool,
    },
    #[error(
        "{path} is not an Arbor store (it is not a SQLite file, or belongs to another program)"
    )]
    NotAStore { path: String },
    #[error(
        "store {path} was written by a newer Arbor (schema version {found}; this build knows up to {known}): upgrade arbor to use it"
    )]
    NewerStore {
        path: String,
        found: i64,
        known: i64,
    },
    /// The supervisor has no store, and the call needs one (`read_store`,
    /// `resume`).
    #[error(
        "{}",
        if *.resume { "resume needs a store" } else { "this supervisor has no store" }
    )]
    NoStore { resume: bool },
    /// A replay was asked of a supervisor with a store (a replay must never
    /// overwrite what it is checked against).
    #[error("a replay runs on a supervisor without a store")]
    ReplayWithStore,
    /// A read or write of the store's file failed (SQL or I/O).
    #[error("{}: {source}", path.display())]
    StoreIo {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A batch could not be written (after retrying while the file was busy).
    #[error("cannot write {}: {source}", path.display())]
    StoreWrite {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A stored tree's records are not what this build can read.
    #[error("{path}: tree {tree}: {reason}")]
    StoreCorrupt {
        path: String,
        tree: String,
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
    #[error("tree {tree} cannot be resumed: {reason}")]
    NotResumable { tree: String, reason: String },
    /// Another process claimed the tree after this one (its fencing epoch is
    /// higher): this process stops running it and writes nothing more of it.
    #[error(
        "tree {tree} was taken over by another process (claim epoch {current}; this process \
         held {epoch}): it stopped here and goes on there"
    )]
    Fenced {
        tree: String,
        epoch: u64,
        current: u64,
    },
}

impl Error {
    /// Whether trying the same thing again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Spawn(_))
    }
}

//! The supervisor's error type.

/// What can go wrong when starting or querying a tree.
#[derive(Debug, thiserror::Error)]
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
    StoreOpen { path: String, reason: String },
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

//! Arbor's supervisor: starts trees of agents and owns what is tree-wide:
//! limits, live slots, the deadline, cancellation, events and the run registry.
//!
//! Knows no HTTP and no CLI; the binary and the service build on it.
//!
//! Entry points: a [`Catalog`] (templates, models, tools, checked once), a
//! [`Supervisor`] built on it that starts trees ([`StartRequest`] →
//! [`TreeHandle`]) under [`TreeLimits`], its [`EventBus`], and, for durable
//! trees, the [`store`] ([`store::Store`], [`store::SqliteStore`]).

#![deny(missing_docs)]

mod approvals;
mod bus;
mod catalog;
mod error;
mod limits;
mod policy;
mod prompt_context;
mod recovery;
mod registry;
pub mod request;
mod slots;
pub mod store;
mod supervisor;
mod tree;
mod workspace;

pub use approvals::PendingApproval;
pub use bus::{EventBus, EventStream};
pub use catalog::{Catalog, CatalogBuilder, OverrideCheck, OverrideRefused, ToolSource};
pub use error::{BoxError, Error, StoreUse};
pub use limits::{OnBudget, RaiseRefused, Raised, TreeLimits, out_of_range};
pub use policy::{PatternError, ToolPolicy, ToolRule, check_pattern, matches as pattern_matches};
pub use prompt_context::{PromptContext, PromptScene};
pub use recovery::{RecordedReply, Recovery, Spent, Tape};
pub use registry::Retain;
pub use store::{EventType, JournalEntry, TreeStatus, UnknownEventType, journal_view};
pub use supervisor::{
    AlwaysAllowedNow, BudgetOutcome, CancelOutcome, Canceller, CatalogResolver, DEFAULT_TURN_QUEUE,
    Multitask, Queued, StartRequest, Supervisor, Target, TreeHandle, TurnDecision, TurnRequest,
    TurnStart, TurnsNow, decide_turn, new_tree_id,
};
pub use workspace::{WorkspaceOpener, WorkspaceSpec};

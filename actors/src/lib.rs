//! Arbor's agents: messages, history, `AgentState`, the ports (`Model`, `Tool`,
//! `TreeHooks`), the pure step machine and the agent actor that drives it.
//!
//! This crate knows no HTTP, SQL, CLI or TOML; the supervisor and the binary
//! build on it.

#![deny(missing_docs)]

mod agent;
pub mod approval;
mod checkpoint;
pub mod compact;
pub mod durable;
pub mod duration;
mod event;
mod event_line;
mod failure;
pub mod handler;
pub mod history;
pub mod hooks;
pub mod id;
pub mod idmap;
pub mod lifecycle;
mod limit;
pub mod message;
pub mod model;
pub mod models;
mod names;
pub mod output;
pub mod schema;
pub mod spawn;
pub mod state;
pub mod steer;
mod step;
mod supervision;
pub mod sync;
pub mod template;
pub mod tool;
pub mod toolbox;
pub mod worktree;

pub use agent::{AgentActor, AgentArgs, AgentMsg, AgentSnapshot, CancelReason, Reply, RunResult};
pub use checkpoint::{Checkpoint, Recovered};
pub use event::{Event, EventKind, EventType, UnknownEventType};
pub use failure::{Failure, FailureKind};
pub use history::History;
pub use hooks::{RunIds, TreeHooks};
pub use id::{AgentId, IdError, RunId, TreeId};
pub use limit::{Limit, LimitHit, out_of_range};
pub use message::{Content, Message, Part, ToolCall, ToolInput, ToolResultPart};
pub use model::{
    Delta, DeltaSink, Model, ModelError, ModelRequest, ModelResponse, RequestMeta, Usage,
    UsageSource,
};
pub use state::{AgentState, AgentStatus, ToolDefinition};
pub use step::{
    Action, Catalog, EndSeal, HOOK_CONTEXT, HookRequest, Planned, STOP_HOOK, StepMachine,
    background,
};
pub use template::{AgentTemplate, FailurePolicy, OnTurnEnd, OutputMode};
pub use tool::{Tool, ToolContext, ToolError, ToolOutput};

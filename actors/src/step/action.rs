//! What the step machine asks of its driver ([`Action`]) and of the
//! catalog it plans with ([`Catalog`]).

use std::sync::Arc;

use serde_json::Value;

use super::hooked;
use crate::model::ModelRequest;
use crate::spawn::{ChildPlan, SpawnChildren};
use crate::template::AgentTemplate;
use crate::tool::Tool;

/// A requested child: its plan, or the requested agent type and why it is refused.
pub type Planned = Result<ChildPlan, (String, String)>;

/// Work the actor must start; results come back through the machine's methods.
pub enum Action {
    /// Send this request to the template's model; answer with `model_replied`.
    CallModel(ModelRequest),
    /// Run an external tool; answer with `tool_done`.
    RunTool {
        /// The step of the call.
        step: u32,
        /// The call's index among the step's tool calls.
        index: usize,
        /// The id of the model's call it answers.
        call_id: String,
        /// The tool.
        tool: Arc<dyn Tool>,
        /// Its input, checked against its schema.
        input: Value,
    },
    /// Run the `Stop` (a root) or `SubagentStop` (a child) hooks before the
    /// turn ends; answer with `stop_hooks_done`.
    RunStopHooks {
        /// The step that would end the turn.
        step: u32,
        /// Which hooks.
        event: crate::lifecycle::HookEvent,
        /// The text of the agent's last reply.
        last_message: String,
        /// Whether the agent goes on now because a stop hook blocked before.
        active: bool,
    },
    /// Seal the run's worktree (it completes); answer with
    /// `worktree_sealed`.
    SealWorktree,
    /// Run the `UserPromptSubmit` (a root) or `SubagentStart` (a child)
    /// hooks before the run's first step; answer with `start_hooks_done`.
    RunStartHooks {
        /// Which hooks.
        event: crate::lifecycle::HookEvent,
        /// The run's prompt (the `prompt` a `UserPromptSubmit` hook reads).
        prompt: String,
    },
    /// Run the `PreToolUse` hooks of these calls; answer with `hooks_done`.
    RunHooks {
        /// The step of the calls.
        step: u32,
        /// The calls, each with its input.
        calls: Vec<hooked::HookRequest>,
    },
    /// Start the children of a `spawn_agents` call; answer with `spawn_done`.
    SpawnAgents {
        /// The step of the call.
        step: u32,
        /// The call's index among the step's tool calls.
        index: usize,
        /// Each requested child, in request order: its kind in the call's
        /// plan, or the requested agent type and why it is refused.
        children: SpawnChildren,
    },
    /// Start the child of a `spawn_agent_inline` call; answer with `inline_done`.
    SpawnInline {
        /// The step of the call.
        step: u32,
        /// The call's index among the step's tool calls.
        index: usize,
        /// The child.
        child: ChildPlan,
    },
    /// Start the children of a `spawn_agents_async` call in the background;
    /// answer at once with `background_started`, and later with
    /// `background_reported` for each child's final report.
    SpawnBackground {
        /// The step of the call.
        step: u32,
        /// The call's index among the step's tool calls.
        index: usize,
        /// Each requested child, in request order: its plan, or the requested
        /// agent type and why it is refused.
        children: Vec<Result<ChildPlan, (String, String)>>,
    },
    /// Start again, under their agent ids, the background children a run
    /// going on from a checkpoint still waits for (semantics §15); each
    /// reports with `background_reported`. A child that cannot be planned
    /// again gets a failed report.
    Relaunch {
        /// Each child's agent id and its plan (or its type and why not).
        children: Vec<(crate::id::AgentId, Planned)>,
    },
    /// The turn is over but background children still run: give the live
    /// slot back; `background_reported` answers.
    AwaitChildren,
    /// Calls of this step wait for a person's decision (`approvalRequested`
    /// events say which): give the live slot back; `decide` answers.
    AwaitApproval,
    /// The run is over; `state().status` says how.
    Finish,
}

/// Lookups the machine needs to plan spawns and gate calls (pure reads of
/// the catalog and of the tree's approval rules).
pub trait Catalog {
    /// The template with exactly this id.
    fn template(&self, id: &str) -> Option<Arc<AgentTemplate>>;
    /// Whether any template answers to `requested` (for "not found" vs "not allowed").
    fn knows_agent(&self, requested: &str) -> bool;
    /// Whether a person allowed every call of `tool` (by the name templates
    /// use) in this tree for good: a call of it that needs approval runs
    /// without asking (semantics §12). None by default.
    fn always_allowed(&self, tool: &str) -> bool {
        let _ = tool;
        false
    }
    /// Whether `event` (`Stop` or `SubagentStop`) hooks run when an agent
    /// of `agent_type` ends its turn. None by default.
    fn hooks_at(&self, event: crate::lifecycle::HookEvent, agent_type: &str) -> bool {
        let _ = (event, agent_type);
        false
    }
    /// Whether `PreToolUse` hooks run before a call of `tool` (by the name
    /// templates use) by an agent of type `agent_type`: the call waits for
    /// their verdict. None by default.
    fn hooks_before(&self, tool: &str, agent_type: &str) -> bool {
        let _ = (tool, agent_type);
        false
    }
}

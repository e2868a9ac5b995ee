//! `AgentState`: everything one run owns, serialisable in the wire format of semantics §2.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::failure::FailureKind;
use crate::history::History;
use crate::id::{AgentId, RunId, RunIds};

/// How a run ended, or that it is still going.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentStatus {
    /// Still going (the default).
    #[default]
    Running,
    /// Ended normally.
    Completed,
    /// Ended by an error or a limit.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl AgentStatus {
    /// Whether the run is over.
    pub fn is_final(self) -> bool {
        self != AgentStatus::Running
    }

    /// The wire name (`running`, `completed`, `failed`, `cancelled`).
    pub fn as_str(self) -> &'static str {
        match self {
            AgentStatus::Running => "running",
            AgentStatus::Completed => "completed",
            AgentStatus::Failed => "failed",
            AgentStatus::Cancelled => "cancelled",
        }
    }
}

/// A tool as the model sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// What the tool does, for the model.
    pub description: String,
    /// The JSON Schema of its input.
    #[serde(rename = "inputSchema")]
    pub input_schema: Value,
}

/// Tool definitions by name; shared between every agent of a template.
pub type ToolDefinitions = Arc<BTreeMap<String, ToolDefinition>>;

/// One run's state (semantics §2); every field but `agentId` and `runId`
/// may be absent on input and takes its default. Ids are typed and
/// serialise as their text (`"t1/0.2~1"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentState {
    /// This agent's id (the same for all its attempts).
    pub agent_id: AgentId,
    /// The template it runs; for a child, the matched `spawnableAgents` entry.
    #[serde(default)]
    pub agent_type: Option<String>,
    /// This run's id.
    pub run_id: RunId,
    /// The parent's agent id; `None` for a root.
    #[serde(default)]
    pub parent_id: Option<AgentId>,
    /// Run ids from the root down to the parent; its length is the depth.
    /// Shared: every child of one parent holds the same list (issue 17:
    /// copied, it was a vector and one string per ancestor for every agent).
    #[serde(default)]
    pub ancestor_run_ids: Arc<[RunId]>,
    /// Every child run that started, in request order.
    #[serde(default)]
    pub child_run_ids: Vec<RunId>,
    /// The conversation.
    #[serde(default)]
    pub message_history: History,
    /// The last accepted `set_output` value; a failed run's is `{errorMessage}`.
    #[serde(default)]
    pub output: Option<Value>,
    /// Sent as the system message of every model call.
    #[serde(default)]
    pub system_prompt: Arc<str>,
    /// Exactly the tools the model is offered, by wire name.
    #[serde(default)]
    pub tool_definitions: ToolDefinitions,
    /// Input plus output tokens of the latest model call (reported, else estimated).
    #[serde(default)]
    pub context_token_count: u64,
    /// Steps left before the agent's step limit.
    #[serde(default)]
    pub steps_remaining: u32,
    /// Credits spent by this agent and all its descendants.
    #[serde(default)]
    pub credits_used: f64,
    /// Credits spent by this agent's own model calls.
    #[serde(default)]
    pub direct_credits_used: f64,
    /// Whether it runs, or how it ended.
    #[serde(default)]
    pub status: AgentStatus,
    /// What kind of failure ended a failed run (its `output` says it in words).
    /// Absent while it runs, when it did not fail, and in states stored by a
    /// build before kinds were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<FailureKind>,
    /// The branch a run of an `isolation = "worktree"` template left its
    /// work on, once it completed (absent for every other run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Boxed: every agent's state holds the field, few have a report.
    pub worktree: Option<Box<crate::worktree::WorktreeReport>>,
}

/// Where a run starts: what [`AgentState::initial`] builds its state from,
/// for a root and a child alike.
#[derive(Clone, Debug)]
pub struct Start {
    /// The run's agent id and run id.
    pub ids: RunIds,
    /// The template it runs (for a child, the matched `spawnableAgents` entry).
    pub agent_type: String,
    /// The parent's agent id and the run ids above the new run (the parent's
    /// ancestors, then the parent); `None` for a root.
    pub parent: Option<(AgentId, Arc<[RunId]>)>,
    /// The history the run starts its turn with (inherited messages, then its
    /// input messages).
    pub history: History,
    /// Its system prompt.
    pub system_prompt: Arc<str>,
    /// The tools its model is offered.
    pub tool_definitions: ToolDefinitions,
    /// What the parent's context held when it spawned the run (0 for a root).
    pub context_token_count: u64,
    /// Its step limit (the template's `max_steps`).
    pub steps_remaining: u32,
}

impl AgentState {
    /// The state a run starts with: running, nothing spent, no children, no
    /// output. The one constructor of an initial state (roots and children).
    pub fn initial(start: Start) -> AgentState {
        let (parent_id, ancestor_run_ids) = match start.parent {
            Some((parent, lineage)) => (Some(parent), lineage),
            None => (None, Arc::default()),
        };
        AgentState {
            agent_id: start.ids.agent_id,
            agent_type: Some(start.agent_type),
            run_id: start.ids.run_id,
            parent_id,
            ancestor_run_ids,
            child_run_ids: Vec::new(),
            message_history: start.history,
            output: None,
            system_prompt: start.system_prompt,
            tool_definitions: start.tool_definitions,
            context_token_count: start.context_token_count,
            steps_remaining: start.steps_remaining,
            credits_used: 0.0,
            direct_credits_used: 0.0,
            status: AgentStatus::Running,
            error_kind: None,
            worktree: None,
        }
    }

    /// The state of the root run `run_id` before anything happened: running,
    /// with no history, system prompt, tools, steps or spending (for states
    /// built by hand, as tests do; a run starts from [`initial`](Self::initial)).
    pub fn of_run(run_id: RunId) -> AgentState {
        AgentState {
            agent_id: run_id.agent_id(),
            agent_type: None,
            run_id,
            parent_id: None,
            ancestor_run_ids: Arc::default(),
            child_run_ids: Vec::new(),
            message_history: History::new(),
            output: None,
            system_prompt: Arc::default(),
            tool_definitions: ToolDefinitions::default(),
            context_token_count: 0,
            steps_remaining: 0,
            credits_used: 0.0,
            direct_credits_used: 0.0,
            status: AgentStatus::Running,
            error_kind: None,
            worktree: None,
        }
    }

    /// The parent's run id (the last of [`ancestor_run_ids`](Self::ancestor_run_ids));
    /// `None` for a root.
    pub fn parent_run_id(&self) -> Option<&RunId> {
        self.ancestor_run_ids.last()
    }

    /// Depth in the tree: 0 for a root.
    pub fn depth(&self) -> usize {
        self.ancestor_run_ids.len()
    }

    /// The error message of a failed or cancelled run, if its output carries one.
    pub fn error_message(&self) -> Option<&str> {
        let output = self.output.as_ref()?;
        output
            .get("errorMessage")
            .or_else(|| output.get("message"))
            .and_then(Value::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A state as Codebuff writes it (with fields Arbor does not know), with
    /// ids of Arbor's shape (typed ids read only those).
    fn codebuff_state() -> Value {
        json!({
            "agentId": "t1/0.1",
            "agentType": "codebuff/researcher@0.1.0",
            "runId": "t1/0.1",
            "parentId": "t1/0",
            "ancestorRunIds": ["t1/0"],
            "childRunIds": [],
            "messageHistory": [
                {"role": "user", "content": "find it"},
                {"role": "assistant", "content": [
                    {"type": "tool-call", "toolCallId": "x", "toolName": "read_files", "input": {"paths": ["a"]}}
                ]},
                {"role": "tool", "toolCallId": "x", "toolName": "read_files",
                 "content": [{"type": "json", "value": {"a": "..."}}]}
            ],
            "output": null,
            "systemPrompt": "You research.",
            "toolDefinitions": {"read_files": {"description": "read", "inputSchema": {"type": "object"}}},
            "contextTokenCount": 120,
            "stepsRemaining": 12,
            "creditsUsed": 3.5,
            "directCreditsUsed": 1.5,
            "agentContext": {},
            "subagents": []
        })
    }

    #[test]
    fn a_codebuff_shaped_state_loads() {
        let state: AgentState = serde_json::from_value(codebuff_state()).unwrap();
        assert_eq!(
            state.agent_type.as_deref(),
            Some("codebuff/researcher@0.1.0")
        );
        assert_eq!(state.message_history.len(), 3);
        assert_eq!(state.depth(), 1);
        assert_eq!(state.status, AgentStatus::Running);
        assert_eq!(state.tool_definitions["read_files"].description, "read");
    }

    /// States as the build before typed ids (5c8d466) wrote them: a
    /// helper's final state from `arbor show --json` on the scripted tree
    /// (`finalText` taken out, as the CLI adds it), and one with every id
    /// shape (a follow-up turn, retried runs, a tree id of the format before
    /// issue 33, a failure kind).
    const STATES_OF_THE_BUILD_BEFORE_TYPED_IDS: [&str; 2] = [
        r#"{"agentId":"t01a24f2c0585708d8969d4ee45797cc5/0.1.1","agentType":"helper","runId":"t01a24f2c0585708d8969d4ee45797cc5/0.1.1","parentId":"t01a24f2c0585708d8969d4ee45797cc5/0.1","ancestorRunIds":["t01a24f2c0585708d8969d4ee45797cc5/0","t01a24f2c0585708d8969d4ee45797cc5/0.1"],"childRunIds":[],"messageHistory":[{"role":"user","content":"dig","tags":["SPAWN_PROMPT"]},{"role":"assistant","content":[{"type":"tool-call","toolCallId":"t01a24f2c0585708d8969d4ee45797cc5/0.1.1-s1-c0","toolName":"set_output","input":{"found":42}}]},{"role":"tool","toolCallId":"t01a24f2c0585708d8969d4ee45797cc5/0.1.1-s1-c0","toolName":"set_output","content":[{"type":"json","value":{"ok":true}}]}],"output":{"found":42},"systemPrompt":"","toolDefinitions":{"end_turn":{"description":"End your turn after this step.","inputSchema":{"type":"object"}},"set_output":{"description":"Set your output to this object (replaces any earlier output).","inputSchema":{"type":"object"}}},"contextTokenCount":10,"stepsRemaining":19,"creditsUsed":0.0625,"directCreditsUsed":0.0625,"status":"completed"}"#,
        r#"{"agentId":"t1c2a3b4c5d6e/0~1.1~1.2","agentType":"worker","runId":"t1c2a3b4c5d6e/0~1.1~1.2~3","parentId":"t1c2a3b4c5d6e/0~1.1","ancestorRunIds":["t1c2a3b4c5d6e/0~1","t1c2a3b4c5d6e/0~1.1~1"],"childRunIds":["t1c2a3b4c5d6e/0~1.1~1.2~3.0","t1c2a3b4c5d6e/0~1.1~1.2~3.0~1","t1c2a3b4c5d6e/0~1.1~1.2~3.10"],"messageHistory":[{"role":"user","content":"go"}],"output":{"errorMessage":"child failed"},"systemPrompt":"You work.","toolDefinitions":{},"contextTokenCount":7,"stepsRemaining":3,"creditsUsed":0.5,"directCreditsUsed":0.25,"status":"failed","errorKind":"child_failed"}"#,
    ];

    /// Typed ids keep the wire: a state stored or served by the build
    /// before them reads, and writes back byte for byte.
    #[test]
    fn states_with_typed_ids_write_back_the_json_of_the_build_before_them() {
        for text in STATES_OF_THE_BUILD_BEFORE_TYPED_IDS {
            let state: AgentState = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&state).unwrap(), text);
        }
        let retried: AgentState =
            serde_json::from_str(STATES_OF_THE_BUILD_BEFORE_TYPED_IDS[1]).unwrap();
        assert_eq!(retried.agent_id.attempt(3), retried.run_id);
        assert_eq!(retried.run_id.agent_id(), retried.agent_id);
        assert_eq!(
            retried.parent_run_id().map(RunId::agent_id),
            retried.parent_id
        );
        assert_eq!(retried.depth(), 2);
        assert_eq!(retried.child_run_ids[2].path().len(), 4);
    }

    /// An id that is not a run id is refused when a state is read, naming it.
    #[test]
    fn a_state_with_an_id_that_is_no_run_id_is_refused() {
        let mut state = codebuff_state();
        state["childRunIds"] = json!(["t1/0.1.x"]);
        let error = serde_json::from_value::<AgentState>(state).unwrap_err();
        assert!(error.to_string().contains("t1/0.1.x"), "{error}");
    }

    #[test]
    fn state_round_trips_through_json() {
        let mut state: AgentState = serde_json::from_value(codebuff_state()).unwrap();
        state.status = AgentStatus::Completed;
        state.output = Some(json!({"answer": 42}));
        let text = serde_json::to_string(&state).unwrap();
        let back: AgentState = serde_json::from_str(&text).unwrap();
        assert_eq!(back, state);
        let value: Value = serde_json::from_str(&text).unwrap();
        for key in [
            "agentId",
            "agentType",
            "runId",
            "parentId",
            "ancestorRunIds",
            "childRunIds",
            "messageHistory",
            "output",
            "systemPrompt",
            "toolDefinitions",
            "contextTokenCount",
            "stepsRemaining",
            "creditsUsed",
            "directCreditsUsed",
            "status",
        ] {
            assert!(value.get(key).is_some(), "missing {key}");
        }
        assert_eq!(value["status"], "completed");
    }
}

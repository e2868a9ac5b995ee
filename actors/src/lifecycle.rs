//! Lifecycle hooks, as Claude Code defines them: the user's commands that run
//! at `PreToolUse`, `PostToolUse`, `UserPromptSubmit`, `SubagentStart`,
//! `SubagentStop` and `Stop`, get the event as JSON on stdin, and answer by
//! their exit code and JSON on stdout. This module is what their answers
//! mean, and nothing else: pure, so every rule is a unit test. Running the
//! commands is `arbor_tools::hooks`.
//!
//! The contract (Claude Code's hooks reference):
//! - **Exit 0**: success. Stdout, when it is a JSON object, is read (below);
//!   for `UserPromptSubmit` and `SubagentStart`, stdout that is not JSON is
//!   context added for the model.
//! - **Exit 2**: a blocking error; stderr is the reason. `PreToolUse`: the
//!   call does not run and the model reads the reason. `PostToolUse`: the
//!   tool ran; the model reads the reason beside its result (these run
//!   only after a call that succeeded, as in Claude Code). `Stop`,
//!   `SubagentStop`: the agent does not stop; the reason is its next
//!   instruction. `UserPromptSubmit`: the prompt is refused.
//! - **Any other exit, a timeout, a command that does not start**: a
//!   non-blocking error, logged; the action goes on.
//! - **JSON** (exit 0): `continue: false` stops the agent (`stopReason`):
//!   at `PreToolUse` none of the step's calls runs and the run ends, at
//!   `PostToolUse` the run ends once the call's result is in (both failed,
//!   kind `blocked`, with the reason), at `UserPromptSubmit` the prompt is
//!   refused, and it ends a turn a stop hook would keep going;
//!   `decision: "block"` with `reason` blocks as exit 2 does (`"approve"`,
//!   and for `PreToolUse` the older `"block"`/`"approve"`, map to deny/allow);
//!   `hookSpecificOutput` carries `permissionDecision` (`allow`, `deny`,
//!   `ask`: ask is an Arbor approval), `permissionDecisionReason`,
//!   `updatedInput` (the tool call's new input) and `additionalContext`.
//!
//! Several hooks on one event: any stop wins, then any block; among
//! permissions deny beats ask beats allow; contexts are kept in order; the
//! last updated input wins.

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The tree's lifecycle hooks, as its agents see them (the runtime's hook
/// set: `arbor_tools::hooks::HookSet`). An agent never awaits them in its
/// handler: it runs them in a task and takes the verdict back as a message.
pub trait Lifecycle: Send + Sync {
    /// Whether any hook runs at `event` for `name` (a tool name, by the
    /// name templates use, or an agent type).
    fn wants(&self, event: HookEvent, name: &str) -> bool;
    /// Whether any hook runs at a tool's `event` for a call of `tool` by an
    /// agent of type `agent_type` (hooks may be an agent's own); by default
    /// [`wants`](Self::wants), whoever calls.
    fn wants_tool(&self, event: HookEvent, tool: &str, agent_type: &str) -> bool {
        let _ = agent_type;
        self.wants(event, tool)
    }
    /// Runs the hooks of `event` for `name` with `input` (the event's own
    /// fields: `tool_name`, `tool_input`, …) and decides.
    fn run(
        &self,
        event: HookEvent,
        name: &str,
        input: Map<String, Value>,
        call: HookCall,
    ) -> BoxFuture<'static, Verdict>;
}

/// Who runs a hook: the ids a hook is told.
#[derive(Clone, Debug, Default)]
pub struct HookCall {
    /// The tree (Claude Code's `session_id`).
    pub tree_id: String,
    /// The agent's run.
    pub run_id: String,
    /// The agent's type, if it has one.
    pub agent_type: Option<String>,
    /// The tree's workspace, if it has one (the hook's `cwd` and
    /// `CLAUDE_PROJECT_DIR`).
    pub workspace: Option<std::path::PathBuf>,
}

/// When a hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum HookEvent {
    /// Before a tool call runs (after the model made it).
    PreToolUse,
    /// After a tool call ran.
    PostToolUse,
    /// When a prompt is given to a tree (its first or a later turn).
    UserPromptSubmit,
    /// When a child agent starts.
    SubagentStart,
    /// When a child agent is about to end its turn.
    SubagentStop,
    /// When the root agent is about to end its turn.
    Stop,
}

impl HookEvent {
    /// Every event, in the order above.
    pub const ALL: [HookEvent; 6] = [
        HookEvent::PreToolUse,
        HookEvent::PostToolUse,
        HookEvent::UserPromptSubmit,
        HookEvent::SubagentStart,
        HookEvent::SubagentStop,
        HookEvent::Stop,
    ];

    /// The name Claude Code and the config use (`PreToolUse`).
    pub fn name(self) -> &'static str {
        match self {
            HookEvent::PreToolUse => "PreToolUse",
            HookEvent::PostToolUse => "PostToolUse",
            HookEvent::UserPromptSubmit => "UserPromptSubmit",
            HookEvent::SubagentStart => "SubagentStart",
            HookEvent::SubagentStop => "SubagentStop",
            HookEvent::Stop => "Stop",
        }
    }

    /// The event of that name.
    pub fn from_name(name: &str) -> Option<HookEvent> {
        HookEvent::ALL.into_iter().find(|e| e.name() == name)
    }

    /// Whether a matcher picks the hooks of this event by tool name
    /// (`PreToolUse`, `PostToolUse`) or by agent type (`SubagentStart`,
    /// `SubagentStop`); the others ignore it.
    pub fn matches_by(self) -> Option<&'static str> {
        match self {
            HookEvent::PreToolUse | HookEvent::PostToolUse => Some("tool name"),
            HookEvent::SubagentStart | HookEvent::SubagentStop => Some("agent type"),
            HookEvent::UserPromptSubmit | HookEvent::Stop => None,
        }
    }
}

impl std::fmt::Display for HookEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How one hook command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookRun {
    /// Its exit code; `None` when it did not exit by itself (killed at its
    /// timeout, by a signal) or did not start.
    pub exit: Option<i32>,
    /// What it wrote to stdout.
    pub stdout: String,
    /// What it wrote to stderr (or why it did not start or finish).
    pub stderr: String,
}

/// A tool call's permission, as a `PreToolUse` hook gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Permission {
    /// Run it without asking (an approval the template requires is skipped).
    Allow,
    /// Ask a person (an Arbor approval), whatever the template says.
    Ask,
    /// Do not run it; the model reads the reason.
    Deny,
}

/// What one event's hooks decided together. Journaled (an event), so a
/// resumed or replayed tree uses it instead of running the hooks again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// The agent stops (`continue: false`), with this reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<String>,
    /// Blocked (exit 2, or `decision: "block"`), with the reason the model
    /// (or, for a prompt, the caller) reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<String>,
    /// A tool call's permission, if a hook gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission: Option<Permission>,
    /// Why (the permission's reason, joined).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The tool call's input as a hook rewrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_input: Option<Value>,
    /// Text for the model, in the order the hooks gave it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<String>,
    /// Hooks that failed without blocking (for the log), as
    /// "exit N: stderr".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

impl Verdict {
    /// Whether nothing was decided (no hook said anything that matters).
    pub fn is_empty(&self) -> bool {
        self.stop.is_none()
            && self.block.is_none()
            && self.permission.is_none()
            && self.updated_input.is_none()
            && self.context.is_empty()
    }

    /// Whether a tool call may not run: blocked, denied or stopped.
    pub fn refuses_call(&self) -> bool {
        self.stop.is_some() || self.block.is_some() || self.permission == Some(Permission::Deny)
    }

    /// What the model reads for a refused call.
    pub fn refusal(&self) -> String {
        let why = self
            .stop
            .as_deref()
            .or(self.block.as_deref())
            .or(self.reason.as_deref())
            .unwrap_or("no reason given");
        format!("a hook refused this call: {why}")
    }

    /// The context and a block's reason as one text for the model, if any.
    pub fn note_for_model(&self) -> Option<String> {
        let mut parts: Vec<&str> = self.context.iter().map(String::as_str).collect();
        if let Some(block) = &self.block {
            parts.push(block);
        }
        (!parts.is_empty()).then(|| parts.join("\n"))
    }
}

/// The JSON a hook may print (exit 0), as far as Arbor reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Reply {
    #[serde(rename = "continue")]
    go_on: Option<bool>,
    stop_reason: Option<String>,
    decision: Option<String>,
    reason: Option<String>,
    hook_specific_output: Option<Specific>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Specific {
    permission_decision: Option<String>,
    permission_decision_reason: Option<String>,
    updated_input: Option<Value>,
    additional_context: Option<String>,
}

/// What the hooks of `event` that ran (`runs`, in the config's order)
/// decided together.
pub fn decide(event: HookEvent, runs: &[HookRun]) -> Verdict {
    let mut verdict = Verdict::default();
    let mut reasons: Vec<String> = Vec::new();
    for run in runs {
        match run.exit {
            Some(0) => read_reply(event, run, &mut verdict, &mut reasons),
            Some(2) => {
                let why = run.stderr.trim();
                let why = if why.is_empty() {
                    "blocked by a hook (exit 2, nothing on stderr)"
                } else {
                    why
                };
                add_block(&mut verdict, event, why);
            }
            exit => {
                let code = exit.map_or("no exit code".to_owned(), |c| format!("exit {c}"));
                verdict
                    .errors
                    .push(format!("{code}: {}", run.stderr.trim()).trim().to_owned());
            }
        }
    }
    if !reasons.is_empty() {
        verdict.reason = Some(reasons.join("; "));
    }
    verdict
}

fn add_block(verdict: &mut Verdict, event: HookEvent, why: &str) {
    match event {
        // The tool call does not run: deny it, saying why.
        HookEvent::PreToolUse => {
            verdict.permission = Some(Permission::Deny);
            join(&mut verdict.block, why);
        }
        // What cannot be undone: the model reads the reason.
        _ => join(&mut verdict.block, why),
    }
}

fn join(into: &mut Option<String>, text: &str) {
    match into {
        Some(all) => {
            all.push('\n');
            all.push_str(text);
        }
        None => *into = Some(text.to_owned()),
    }
}

fn read_reply(event: HookEvent, run: &HookRun, verdict: &mut Verdict, reasons: &mut Vec<String>) {
    let text = run.stdout.trim();
    let reply = match serde_json::from_str::<Value>(text) {
        Ok(value @ Value::Object(_)) => match serde_json::from_value::<Reply>(value) {
            Ok(reply) => reply,
            Err(e) => {
                verdict
                    .errors
                    .push(format!("its JSON reply is not Claude Code's: {e}"));
                return;
            }
        },
        // Plain text: context for the events whose stdout the model reads.
        _ => {
            if !text.is_empty()
                && matches!(
                    event,
                    HookEvent::UserPromptSubmit | HookEvent::SubagentStart
                )
            {
                verdict.context.push(text.to_owned());
            }
            return;
        }
    };
    if reply.go_on == Some(false) {
        let why = reply
            .stop_reason
            .clone()
            .unwrap_or_else(|| "a hook stopped the agent".to_owned());
        join(&mut verdict.stop, &why);
    }
    match (event, reply.decision.as_deref()) {
        (HookEvent::PreToolUse, Some("approve")) => raise(verdict, Permission::Allow),
        (_, Some("block")) => {
            let why = reply
                .reason
                .clone()
                .unwrap_or_else(|| "blocked by a hook".to_owned());
            add_block(verdict, event, &why);
        }
        _ => {}
    }
    if let Some(specific) = reply.hook_specific_output {
        if event == HookEvent::PreToolUse {
            let permission = match specific.permission_decision.as_deref() {
                Some("allow") => Some(Permission::Allow),
                Some("ask") => Some(Permission::Ask),
                Some("deny") => Some(Permission::Deny),
                Some(other) => {
                    verdict.errors.push(format!(
                        "permissionDecision {other:?} is not allow, deny or ask: ignored"
                    ));
                    None
                }
                None => None,
            };
            if let Some(permission) = permission {
                raise(verdict, permission);
                if let Some(why) = specific.permission_decision_reason {
                    reasons.push(why);
                }
            }
            if let Some(input) = specific.updated_input {
                if input.is_object() {
                    verdict.updated_input = Some(input);
                } else {
                    verdict
                        .errors
                        .push("updatedInput is not a JSON object: ignored".to_owned());
                }
            }
        }
        if let Some(context) = specific.additional_context
            && !context.trim().is_empty()
        {
            verdict.context.push(context);
        }
    }
}

/// Keeps the strongest permission: deny over ask over allow.
fn raise(verdict: &mut Verdict, permission: Permission) {
    verdict.permission = Some(verdict.permission.map_or(permission, |p| p.max(permission)));
}

/// The fields a tool's hooks get of its call (Claude Code's names).
pub fn tool_fields(tool: &str, input: Value, call_id: String) -> Map<String, Value> {
    let mut fields = Map::new();
    fields.insert("tool_name".into(), tool.into());
    fields.insert("tool_input".into(), input);
    fields.insert("tool_use_id".into(), call_id.into());
    fields
}

/// A tool call's result with what hooks gave the model beside it: one more
/// part of an output, one more line of an error.
pub fn with_note(
    result: Result<crate::tool::ToolOutput, crate::tool::ToolError>,
    note: String,
) -> Result<crate::tool::ToolOutput, crate::tool::ToolError> {
    match result {
        Ok(output) => {
            let mut parts = output.into_parts();
            parts.push(crate::message::ToolResultPart::Json { value: note.into() });
            Ok(crate::tool::ToolOutput::Parts(parts))
        }
        Err(error) => Err(crate::tool::ToolError::new(format!("{error}\n{note}"))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ok(stdout: &str) -> HookRun {
        HookRun {
            exit: Some(0),
            stdout: stdout.to_owned(),
            stderr: String::new(),
        }
    }

    fn exit(code: i32, stderr: &str) -> HookRun {
        HookRun {
            exit: Some(code),
            stdout: String::new(),
            stderr: stderr.to_owned(),
        }
    }

    #[test]
    fn exit_2_blocks_a_tool_call_with_stderr_as_the_reason_and_exit_1_does_not() {
        let blocked = decide(
            HookEvent::PreToolUse,
            &[exit(2, "Blocked: rm commands are not allowed\n")],
        );
        assert!(blocked.refuses_call());
        assert_eq!(blocked.permission, Some(Permission::Deny));
        assert_eq!(
            blocked.refusal(),
            "a hook refused this call: Blocked: rm commands are not allowed"
        );
        let failed = decide(HookEvent::PreToolUse, &[exit(1, "jq: not found")]);
        assert!(!failed.refuses_call());
        assert!(failed.is_empty());
        assert_eq!(failed.errors, ["exit 1: jq: not found"]);
        let killed = decide(
            HookEvent::PreToolUse,
            &[HookRun {
                exit: None,
                stdout: String::new(),
                stderr: "timed out after 10s".into(),
            }],
        );
        assert!(!killed.refuses_call());
        assert_eq!(killed.errors, ["no exit code: timed out after 10s"]);
    }

    #[test]
    fn permissions_combine_deny_over_ask_over_allow_with_their_reasons() {
        let reply = |d: &str, why: &str| {
            ok(&json!({"hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": d,
                "permissionDecisionReason": why,
            }})
            .to_string())
        };
        let allow = decide(HookEvent::PreToolUse, &[reply("allow", "docs are safe")]);
        assert_eq!(allow.permission, Some(Permission::Allow));
        assert!(!allow.refuses_call());
        let ask = decide(
            HookEvent::PreToolUse,
            &[reply("allow", "a"), reply("ask", "b")],
        );
        assert_eq!(ask.permission, Some(Permission::Ask));
        let deny = decide(
            HookEvent::PreToolUse,
            &[reply("deny", "no secrets"), reply("allow", "fine")],
        );
        assert_eq!(deny.permission, Some(Permission::Deny));
        assert!(deny.refuses_call());
        assert_eq!(deny.refusal(), "a hook refused this call: no secrets; fine");
        // The older top-level decision of a PreToolUse hook.
        let old = decide(HookEvent::PreToolUse, &[ok(r#"{"decision": "approve"}"#)]);
        assert_eq!(old.permission, Some(Permission::Allow));
    }

    #[test]
    fn an_updated_input_replaces_the_call_input_and_the_last_one_wins() {
        let rewrite = |command: &str| {
            ok(&json!({"hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "allow",
                "updatedInput": {"command": command},
            }})
            .to_string())
        };
        let verdict = decide(
            HookEvent::PreToolUse,
            &[rewrite("npm test"), rewrite("npm test -- --ci")],
        );
        assert_eq!(
            verdict.updated_input,
            Some(json!({"command": "npm test -- --ci"}))
        );
        let bad = decide(
            HookEvent::PreToolUse,
            &[ok(
                r#"{"hookSpecificOutput": {"updatedInput": "rm -rf /"}}"#,
            )],
        );
        assert_eq!(bad.updated_input, None);
        assert_eq!(bad.errors, ["updatedInput is not a JSON object: ignored"]);
    }

    #[test]
    fn post_tool_use_context_and_blocks_reach_the_model_in_order() {
        let verdict = decide(
            HookEvent::PostToolUse,
            &[
                ok(
                    r#"{"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": "lint: 2 warnings"}}"#,
                ),
                ok(r#"{"decision": "block", "reason": "the file no longer compiles"}"#),
            ],
        );
        assert_eq!(
            verdict.note_for_model().as_deref(),
            Some("lint: 2 warnings\nthe file no longer compiles")
        );
        // A PostToolUse block is no permission: the tool ran.
        assert_eq!(verdict.permission, None);
    }

    #[test]
    fn a_stop_hook_that_blocks_keeps_the_agent_going_with_its_reason() {
        let verdict = decide(
            HookEvent::SubagentStop,
            &[ok(
                r#"{"decision": "block", "reason": "Run the tests before you finish."}"#,
            )],
        );
        assert_eq!(
            verdict.block.as_deref(),
            Some("Run the tests before you finish.")
        );
        let by_exit = decide(HookEvent::Stop, &[exit(2, "not done: 3 TODOs left")]);
        assert_eq!(by_exit.block.as_deref(), Some("not done: 3 TODOs left"));
        let lets_stop = decide(HookEvent::Stop, &[ok("{}"), ok("")]);
        assert!(lets_stop.is_empty());
    }

    #[test]
    fn continue_false_stops_the_agent_whatever_else_the_hooks_say() {
        let verdict = decide(
            HookEvent::PostToolUse,
            &[ok(
                r#"{"continue": false, "stopReason": "budget for edits used up"}"#,
            )],
        );
        assert_eq!(verdict.stop.as_deref(), Some("budget for edits used up"));
        assert!(verdict.refuses_call());
    }

    #[test]
    fn plain_stdout_is_context_only_where_claude_code_reads_it() {
        let prompt = decide(HookEvent::UserPromptSubmit, &[ok("Current branch: main\n")]);
        assert_eq!(prompt.context, ["Current branch: main"]);
        let tool = decide(HookEvent::PostToolUse, &[ok("formatted 3 files")]);
        assert!(tool.context.is_empty());
        let junk = decide(HookEvent::PreToolUse, &[ok(r#"{"continue": "yes"}"#)]);
        assert!(junk.is_empty());
        assert_eq!(junk.errors.len(), 1, "{:?}", junk.errors);
    }

    #[test]
    fn a_verdict_round_trips_as_the_journal_writes_it() {
        let verdict = Verdict {
            permission: Some(Permission::Ask),
            reason: Some("touches prod".into()),
            updated_input: Some(json!({"command": "ls"})),
            context: vec!["note".into()],
            ..Verdict::default()
        };
        let text = serde_json::to_string(&verdict).expect("serialises");
        assert_eq!(
            text,
            r#"{"permission":"ask","reason":"touches prod","updatedInput":{"command":"ls"},"context":["note"]}"#
        );
        assert_eq!(
            serde_json::from_str::<Verdict>(&text).expect("reads"),
            verdict
        );
        for event in HookEvent::ALL {
            assert_eq!(HookEvent::from_name(event.name()), Some(event));
        }
    }
}

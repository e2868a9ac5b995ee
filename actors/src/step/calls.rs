//! Step 3 of the loop: every call of a step classified (built-in, external,
//! spawn, or an error the model reads), spawns planned, built-ins' effects.

use std::ops::Index;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{Action, Catalog, Effect, Origin, Pending, StepMachine, hooked};
use crate::history::History;
use crate::message::{Message, Part, ToolCall};
use crate::spawn::{SpawnPlan, SpawnRequest, plan_child};
use crate::template::AgentTemplate;
use crate::toolbox::ToolKind;

/// A step's tool calls, read in place from the assistant message that asked
/// for them, the very `Arc` the history holds: nothing of a call is copied
/// while it runs (a spawn call's input can hold thousands of entries).
pub(super) struct Calls {
    message: Arc<Message>,
    /// Where each call sits among the message's parts, in call order.
    at: Vec<usize>,
}

impl Calls {
    /// The calls of `message` (none if it is not an assistant message).
    pub(super) fn of(message: Arc<Message>) -> Calls {
        let at = message
            .assistant_parts()
            .iter()
            .enumerate()
            .filter(|(_, p)| matches!(p, Part::ToolCall(_)))
            .map(|(i, _)| i)
            .collect();
        Calls { message, at }
    }

    pub(super) fn len(&self) -> usize {
        self.at.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// The assistant message the calls are in.
    pub(super) fn message(&self) -> &Arc<Message> {
        &self.message
    }

    /// The calls in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &ToolCall> {
        self.message.tool_calls()
    }
}

impl Index<usize> for Calls {
    type Output = ToolCall;

    /// The `index`-th call; panics past the end, as a slice does.
    fn index(&self, index: usize) -> &ToolCall {
        match &self.message.assistant_parts()[self.at[index]] {
            Part::ToolCall(call) => call,
            // `of` indexes tool-call parts only, and the message is immutable.
            _ => unreachable!("Calls::at holds only tool-call positions"),
        }
    }
}

impl StepMachine {
    /// Step 3: classify every call; built-ins and bad calls resolve at once.
    pub(super) fn run_calls(
        &mut self,
        calls: Calls,
        origin: Origin,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        let n = calls.len();
        let mut pending = Pending {
            step: self.step,
            calls,
            results: vec![None; n],
            child_runs: vec![Vec::new(); n],
            effects: Vec::new(),
            inline: None,
            awaiting: 0,
            origin,
            held: Default::default(),
            hooking: None,
            hook_notes: Vec::new(),
            forced_asks: Vec::new(),
        };
        let mut needing = Vec::new();
        let mut hooked = Vec::new();
        let mut actions = Vec::new();
        let mut snapshot: Option<Arc<History>> = None;
        let notices = crate::spawn::Notices::default();
        let mut inline_seen = false;
        for index in 0..n {
            // Borrowed, not cloned: a spawn call's input can hold thousands of entries.
            let call = &pending.calls[index];
            let outcome = self.classify(call, &mut inline_seen);
            let (kind, input, approval) = match outcome {
                Ok(ok) => ok,
                Err(error) => {
                    pending.results[index] = Some(Message::tool_error(call, error));
                    continue;
                }
            };
            match kind {
                ToolKind::AddMessage
                | ToolKind::SetMessages
                | ToolKind::SetOutput
                | ToolKind::EndTurn => match builtin_effect(&kind, input, &self.template) {
                    Ok(effect) => {
                        pending.effects.push((index, effect));
                        pending.results[index] =
                            Some(Message::tool_result(call, json!({"ok": true})));
                    }
                    Err(error) => pending.results[index] = Some(Message::tool_error(call, error)),
                },
                ToolKind::External(tool) => {
                    // A resumed program's call that ran before: its
                    // recorded result, and the tool is not run again.
                    if let Some(result) = self.recorded_result(&call.tool_call_id) {
                        pending.results[index] = Some(result.clone());
                        continue;
                    }
                    pending.awaiting += 1;
                    let agent_type = self.state.agent_type.as_deref().unwrap_or_default();
                    if catalog.hooks_before(tool.name(), agent_type) {
                        hooked.push(hooked::Hooked::new(index, tool, input, approval));
                        continue;
                    }
                    if approval {
                        needing.push(index);
                    }
                    actions.push(Action::RunTool {
                        step: self.step,
                        index,
                        call_id: call.tool_call_id.clone(),
                        tool,
                        input,
                    });
                }
                ToolKind::SpawnAgents | ToolKind::SpawnAgentInline | ToolKind::SpawnAgentsAsync => {
                    let inline = matches!(kind, ToolKind::SpawnAgentInline);
                    let background = matches!(kind, ToolKind::SpawnAgentsAsync);
                    let snapshot = snapshot.get_or_insert_with(|| {
                        Arc::new(self.state.message_history.filter_unfinished_tool_calls())
                    });
                    let source = (pending.calls.message().clone(), index);
                    let spawn = (inline, background);
                    match self.plan_spawn(input, source, snapshot, &notices, spawn, catalog) {
                        Ok(action) => {
                            pending.awaiting += 1;
                            actions.push(action(self.step, index));
                        }
                        Err(error) => {
                            pending.results[index] = Some(Message::tool_error(call, error))
                        }
                    }
                }
            }
        }
        if !hooked.is_empty() {
            return self.run_hooks(pending, hooked, needing, actions, catalog);
        }
        if !needing.is_empty() {
            return self.hold_for_approval(pending, needing, actions, catalog);
        }
        self.pending = Some(Box::new(pending));
        if actions.is_empty() {
            return self.commit(catalog);
        }
        actions
    }

    /// Finds the tool and checks the input; `Err` is the message the model will read.
    fn classify(
        &self,
        call: &ToolCall,
        inline_seen: &mut bool,
    ) -> Result<(ToolKind, Value, bool), String> {
        let name = call.tool_name.as_str();
        let Some(entry) = self.toolbox.get(name) else {
            if let Some(denied) = self.toolbox.denied(name) {
                return Err(format!(
                    "Tool {name} ({denied}) is not allowed by this tree's tool policy"
                ));
            }
            return Err(format!(
                "Tool {name} not found. Available tools: {}",
                self.toolbox.names().join(", ")
            ));
        };
        let input = match call.input.value() {
            Value::String(text) => serde_json::from_str(&text)
                .map_err(|e| format!("Arguments of {name} are not valid JSON: {e}"))?,
            Value::Null => json!({}),
            other => other,
        };
        entry
            .schema
            .check(&input)
            .map_err(|e| format!("Invalid input for {name}: {e}"))?;
        if matches!(entry.kind, ToolKind::SpawnAgentInline) {
            if *inline_seen {
                return Err("Only one spawn_agent_inline call is allowed per step".into());
            }
            *inline_seen = true;
        }
        Ok((entry.kind.clone(), input, entry.approval))
    }

    #[allow(clippy::type_complexity)]
    fn plan_spawn(
        &self,
        input: Value,
        (message, call): (Arc<Message>, usize),
        snapshot: &Arc<History>,
        notices: &crate::spawn::Notices,
        (inline, background): (bool, bool),
        catalog: &dyn Catalog,
    ) -> Result<Box<dyn FnOnce(u32, usize) -> Action>, String> {
        let tool = if background {
            crate::toolbox::SPAWN_AGENTS_ASYNC
        } else {
            crate::toolbox::SPAWN_AGENTS
        };
        let plan = |request: SpawnRequest| {
            let agent_type = request.agent_type.clone();
            plan_child(
                &self.template,
                request,
                snapshot,
                notices,
                inline,
                |id| catalog.template(id),
                |id| catalog.knows_agent(id),
            )
            .map_err(|e| (agent_type, e))
        };
        if inline {
            let request = SpawnRequest::deserialize(&input)
                .map_err(|e| format!("Invalid input for spawn_agent_inline: {e}"))?;
            let child = plan(request).map_err(|(_, e)| e)?;
            return Ok(Box::new(move |step, index| Action::SpawnInline {
                step,
                index,
                child,
            }));
        }
        if !background {
            // Planned compactly: a child's plan is made from its entry in the
            // call's text when it comes up (a wide call's children wait as
            // numbers, issue 34).
            let children = SpawnPlan::check(
                &self.template,
                (message, call),
                tool,
                snapshot,
                notices,
                |id| catalog.template(id),
                |id| catalog.knows_agent(id),
            );
            return Ok(Box::new(move |step, index| Action::SpawnAgents {
                step,
                index,
                children,
            }));
        }
        // Each entry on its own: a bad one is refused by itself, the rest run.
        let entries = input
            .get("agents")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let children = entries
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                let named = entry
                    .get("agent_type")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                crate::toolbox::CHILD_SCHEMA
                    .check(entry)
                    .map_err(|e| format!("Invalid input for {tool}: agents[{i}] {e}"))
                    .and_then(|()| {
                        SpawnRequest::deserialize(entry)
                            .map_err(|e| format!("Invalid input for {tool}: agents[{i}]: {e}"))
                    })
                    .map_err(|e| (named.clone(), e))
                    .and_then(plan)
            })
            .collect();
        Ok(Box::new(move |step, index| Action::SpawnBackground {
            step,
            index,
            children,
        }))
    }
}

/// The effect of a built-in call, or the error the model reads.
fn builtin_effect(
    kind: &ToolKind,
    input: Value,
    template: &AgentTemplate,
) -> Result<Effect, String> {
    match kind {
        ToolKind::AddMessage => {
            let content = input["content"].as_str().unwrap_or_default().to_owned();
            Ok(Effect::Add(match input["role"].as_str() {
                Some("assistant") => Message::assistant_text(content),
                _ => Message::user(content),
            }))
        }
        ToolKind::SetMessages => {
            let list = input["messages"].as_array().cloned().unwrap_or_default();
            let messages = list
                .into_iter()
                .enumerate()
                .map(|(i, m)| {
                    serde_json::from_value::<Message>(m)
                        .map_err(|e| format!("Invalid input for set_messages: messages[{i}]: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Effect::Replace(messages))
        }
        ToolKind::SetOutput => {
            if let Some(schema) = &template.output_schema {
                schema
                    .check(&input)
                    .map_err(|e| format!("Output does not match the output schema: {e}"))?;
            }
            Ok(Effect::Output(input))
        }
        ToolKind::EndTurn => Ok(Effect::EndTurn),
        ToolKind::External(_)
        | ToolKind::SpawnAgents
        | ToolKind::SpawnAgentInline
        | ToolKind::SpawnAgentsAsync => Err("internal: not a built-in".into()),
    }
}

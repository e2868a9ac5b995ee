//! An agent's work that leaves the actor: a model call (sent now, or parked
//! until the agent has a live slot again) and a tool call, each on a task of
//! its own whose result comes back as a message (the handler never awaits
//! them).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use ractor::ActorRef;
use serde_json::Value;
use tracing::Instrument;

use super::{AgentMsg, AgentRun, Parked, Phase, ToolOutcome, panic_message};
use crate::event::EventKind;
use crate::failure::{Failure, FailureKind};
use crate::hooks::{Slot, SlotPriority};
use crate::lifecycle::{HookCall, HookEvent, tool_fields, with_note};
use crate::model::{Delta, DeltaSink, ModelRequest};
use crate::step::Action;
use crate::tool::{ToolContext, ToolError};

impl AgentRun {
    pub(super) fn release_reservation(&mut self) {
        let reserved = std::mem::take(&mut self.reserved);
        if reserved > 0 {
            self.hooks.settle(&crate::model::Usage::default(), reserved);
        }
    }

    /// Sends the step, or parks it until a live slot is free again (a parent
    /// that gave its slot back while its children ran).
    pub(super) fn call_model(&mut self, myself: &ActorRef<AgentMsg>, request: ModelRequest) {
        if let Phase::Suspended { parked } = &mut self.phase {
            *parked = Some(Box::new(Parked::Request(request)));
            return self.await_slot(myself);
        }
        self.send_model(myself, request);
    }

    /// Keeps `work` until the agent holds a live slot again, and asks for one.
    pub(super) fn park(&mut self, myself: &ActorRef<AgentMsg>, work: Parked) {
        if let Phase::Suspended { parked } = &mut self.phase {
            *parked = Some(Box::new(work));
            self.await_slot(myself);
        }
    }

    /// Asks for a live slot in a task; `SlotReady` answers (unless cancelled).
    pub(super) fn await_slot(&mut self, myself: &ActorRef<AgentMsg>) {
        let acquire = self.hooks.acquire_slot(SlotPriority {
            depth: self.machine.state().depth(),
            resume: true,
        });
        let me = myself.clone();
        let mut cancelled = self.cancel.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                biased;
                _ = cancelled.wait_for(|c| *c) => {}
                permit = acquire => { let _ = me.cast(AgentMsg::SlotReady(permit)); }
            }
        });
    }

    /// Admits the step against the tree's budgets (only now that it holds a
    /// slot, so a parked request neither reserves tokens nor spends a step) and
    /// starts the model call in a task.
    pub(super) fn send_model(&mut self, myself: &ActorRef<AgentMsg>, mut request: ModelRequest) {
        // While the store is down (or this process may have lost its claim),
        // the request waits, in a task; `StoreReady` brings it back.
        if let Some(ready) = self.hooks.store_ready() {
            let me = myself.clone();
            let mut cancelled = self.cancel.subscribe();
            tokio::spawn(async move {
                tokio::select! {
                    biased;
                    _ = cancelled.wait_for(|c| *c) => {}
                    () = ready => { let _ = me.cast(AgentMsg::StoreReady(Box::new(request))); }
                }
            });
            return;
        }
        request.meta.deadline = self.hooks.deadline();
        let estimate = request.messages.estimated_tokens();
        if let Err(limit) = self.hooks.admit_step(estimate) {
            if limit.limit.is_budget() && self.hooks.pauses_on_budget() {
                // Paused, not failed: no slot is held while it waits.
                self.emit(EventKind::BudgetReached { limit });
                self.suspend();
                if let Phase::Suspended { parked } = &mut self.phase {
                    *parked = Some(Box::new(Parked::Budget(request)));
                }
                return;
            }
            self.emit(EventKind::LimitHit {
                limit: limit.clone(),
            });
            let actions = self.machine.fail(&limit);
            return self.execute(myself, actions);
        }
        self.reserved = estimate;
        let model_name = &self.machine.template().model;
        let Some(model) = self.hooks.model(model_name) else {
            let actions = self.machine.fail(Failure::new(
                FailureKind::ModelNotConfigured,
                format!("model {model_name} is not configured"),
            ));
            return self.execute(myself, actions);
        };
        let step = request.meta.step;
        // A compaction's summary is not the step's reply: its text streams
        // to no reader (they would show it as the step's words).
        let summary = request.meta.summary;
        let hooks = self.hooks.clone();
        let run_id = self.run_id.clone();
        let progress = self.idle.as_ref().map(|idle| idle.progress.clone());
        let sink: DeltaSink = Arc::new(move |delta| {
            if let Some(progress) = &progress {
                progress.touch();
            }
            let kind = match delta {
                Delta::Retry {
                    attempt,
                    delay_ms,
                    reason,
                } => EventKind::ModelRetrying {
                    step,
                    attempt,
                    delay_ms,
                    reason,
                },
                _ if summary => return,
                delta => EventKind::ModelDelta { step, delta },
            };
            hooks.emit(&run_id, kind);
        });
        // The model call (GenAI conventions: `chat {model}`, a client span);
        // an HTTP provider records its own model id and provider name on it.
        let model_name = model.name().to_owned();
        // Integers as i64: the OpenTelemetry layer exports a u64 as a string.
        let span = tracing::info_span!(
            parent: &self.span,
            "step",
            step = i64::from(step),
            otel.name = format!("chat {model_name}").as_str(),
            otel.kind = "client",
            gen_ai.operation.name = "chat",
            gen_ai.request.model = model_name.as_str(),
            gen_ai.provider.name = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let mut call = Box::pin(
            async move {
                let result = AssertUnwindSafe(model.complete(request, sink))
                    .catch_unwind()
                    .await;
                match result {
                    Ok(Ok(response)) => {
                        let span = tracing::Span::current();
                        let usage = &response.usage;
                        if usage.total_tokens() > 0 {
                            let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                            span.record("gen_ai.usage.input_tokens", int(usage.input_tokens));
                            span.record("gen_ai.usage.output_tokens", int(usage.output_tokens));
                        }
                        Ok(response)
                    }
                    Ok(Err(error)) => {
                        let billed = error.billed();
                        Err((failed_span(Failure::from(error)), billed))
                    }
                    Err(panic) => Err((
                        failed_span(Failure::new(
                            FailureKind::Panicked,
                            format!("model panicked: {}", panic_message(panic)),
                        )),
                        None,
                    )),
                }
            }
            .instrument(span),
        );
        // Poll once here: a model that answers without waiting (the simulated
        // one at zero latency) needs no task. Anything that would wait goes on
        // in a task; the handler never awaits it.
        let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
        if let std::task::Poll::Ready(result) = call.as_mut().poll(&mut cx) {
            let _ = myself.cast(AgentMsg::ModelDone {
                step,
                result: Box::new(result),
            });
            return;
        }
        let me = myself.clone();
        self.model_task = Some(tokio::spawn(async move {
            let result = call.await;
            let _ = me.cast(AgentMsg::ModelDone {
                step,
                result: Box::new(result),
            });
        }));
        self.start_timer(myself, step);
        self.watch_idle(myself);
    }

    pub(super) fn run_tool(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        step: u32,
        index: usize,
        call_id: String,
        tool: Arc<dyn crate::tool::Tool>,
        input: Value,
    ) {
        let ctx = ToolContext {
            tree_id: self.hooks.tree_id().clone(),
            run_id: self.run_id.clone(),
            agent_type: self.machine.state().agent_type.clone().unwrap_or_default(),
            call_id,
            workspace: self.workspace.clone(),
        };
        let me = myself.clone();
        let span = tracing::info_span!(
            parent: &self.span,
            "tool",
            step = i64::from(step),
            tool = tool.name(),
            otel.name = format!("execute_tool {}", tool.name()).as_str(),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = tool.name(),
            gen_ai.tool.call.id = ctx.call_id.as_str(),
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        // Its PostToolUse hooks, if it has any, run in the task after it.
        let post = self
            .hooks
            .lifecycle()
            .filter(|l| {
                let agent_type = self
                    .machine
                    .state()
                    .agent_type
                    .as_deref()
                    .unwrap_or_default();
                l.wants_tool(HookEvent::PostToolUse, tool.name(), agent_type)
            })
            .map(|l| (l, self.hook_call(), input.clone()));
        // A call that may change something waits until what led to it is
        // stored (see `TreeHooks::stored`).
        let stored = if tool.is_read_only() {
            None
        } else {
            self.hooks.stored()
        };
        self.tool_tasks.push(tokio::spawn(
            async move {
                let call_id = ctx.call_id.clone();
                let refused = match stored {
                    Some(stored) => stored.await.err(),
                    None => None,
                };
                let mut outcome = match refused {
                    Some(why) => ToolOutcome::Done(Err(ToolError::new(format!(
                        "{} was not run: {}",
                        tool.name(),
                        why.message
                    )))),
                    None => match AssertUnwindSafe(tool.call(input, ctx)).catch_unwind().await {
                        Ok(result) => ToolOutcome::Done(result),
                        Err(panic) => ToolOutcome::Panicked(panic_message(panic)),
                    },
                };
                let mut verdict = None;
                // As in Claude Code, PostToolUse hooks run after a call that
                // succeeded (a failed one is its own event there).
                if let (Some((lifecycle, call, input)), ToolOutcome::Done(result)) =
                    (post, &mut outcome)
                    && result.is_ok()
                {
                    let response = match &*result {
                        Ok(output) => {
                            serde_json::to_value(output.clone().into_parts()).unwrap_or_default()
                        }
                        Err(_) => Value::Null,
                    };
                    let mut fields = tool_fields(tool.name(), input, call_id);
                    fields.insert("tool_response".into(), response);
                    let decided = lifecycle
                        .run(HookEvent::PostToolUse, tool.name(), fields, call)
                        .await;
                    if let Some(note) = post_note(&decided) {
                        *result =
                            with_note(std::mem::replace(result, Err(ToolError::new(""))), note);
                    }
                    verdict = Some(Box::new(decided));
                }
                // A call that failed: status ERROR on its span.
                let span = tracing::Span::current();
                match &outcome {
                    ToolOutcome::Done(Err(error)) => {
                        mark_failed(&span, "tool_error", &error.message)
                    }
                    ToolOutcome::Panicked(message) => mark_failed(&span, "panicked", message),
                    ToolOutcome::Done(Ok(_)) => {}
                }
                let _ = me.cast(AgentMsg::ToolDone {
                    step,
                    index,
                    outcome: Box::new(outcome),
                    post: verdict,
                });
            }
            .instrument(span),
        ));
        self.work_started(myself, step);
    }

    /// A task of the step's own work (a tool, its hooks) started: counted,
    /// watched for progress, and under the step's timer.
    fn work_started(&mut self, myself: &ActorRef<AgentMsg>, step: u32) {
        self.tools_running += 1;
        self.watch_idle(myself);
        if !self.timer.is_running() {
            self.start_timer(myself, step);
        }
    }

    /// Who runs a hook: the ids a hook is told.
    fn hook_call(&self) -> HookCall {
        HookCall {
            tree_id: self.hooks.tree_id().to_string(),
            run_id: self.run_id.to_string(),
            agent_type: self.machine.state().agent_type.clone(),
            // The tree's workspace, where the project's `.claude/` hooks
            // are: a worktree agent's own may not be made yet, and a hook
            // that cannot start there would be skipped.
            workspace: self.hooks.workspace().map(|w| w.root().to_path_buf()),
        }
    }

    /// Runs the `PreToolUse` hooks of `calls` in a task (never in the
    /// handler); their verdicts come back as `HooksDone`.
    pub(super) fn run_hooks(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        step: u32,
        calls: Vec<crate::step::HookRequest>,
    ) {
        let lifecycle = self.hooks.lifecycle();
        let call = self.hook_call();
        let me = myself.clone();
        self.tool_tasks.push(tokio::spawn(async move {
            let runs = calls.into_iter().map(|request| {
                let future = lifecycle.as_ref().map(|lifecycle| {
                    let fields = tool_fields(&request.tool, request.input, request.call_id);
                    lifecycle.run(HookEvent::PreToolUse, &request.tool, fields, call.clone())
                });
                async move {
                    let verdict = match future {
                        Some(future) => future.await,
                        None => crate::lifecycle::Verdict::default(),
                    };
                    (request.index, verdict)
                }
            });
            let verdicts = futures::future::join_all(runs).await;
            let _ = me.cast(AgentMsg::HooksDone {
                step,
                verdicts: Box::new(verdicts),
            });
        }));
        self.work_started(myself, step);
    }

    /// Runs the `Stop` or `SubagentStop` hooks in a task; their verdict
    /// comes back as `StopHooksDone`.
    pub(super) fn run_stop_hooks(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        step: u32,
        event: HookEvent,
        last_message: String,
        active: bool,
    ) {
        let lifecycle = self.hooks.lifecycle();
        let call = self.hook_call();
        let name = call.agent_type.clone().unwrap_or_default();
        let me = myself.clone();
        self.tool_tasks.push(tokio::spawn(async move {
            let mut fields = serde_json::Map::new();
            fields.insert("stop_hook_active".into(), active.into());
            fields.insert("last_assistant_message".into(), last_message.into());
            let verdict = match lifecycle {
                Some(lifecycle) => lifecycle.run(event, &name, fields, call).await,
                None => crate::lifecycle::Verdict::default(),
            };
            let _ = me.cast(AgentMsg::StopHooksDone {
                step,
                verdict: Box::new(verdict),
            });
        }));
        self.work_started(myself, step);
    }

    /// Runs the start hooks (`UserPromptSubmit` with the prompt, or
    /// `SubagentStart` with the agent's ids) in a task; the verdict comes
    /// back as `StartHooksDone`.
    pub(super) fn run_start_hooks(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        event: HookEvent,
        prompt: String,
    ) {
        let lifecycle = self.hooks.lifecycle();
        let call = self.hook_call();
        let name = call.agent_type.clone().unwrap_or_default();
        let me = myself.clone();
        let mut fields = serde_json::Map::new();
        if event == HookEvent::UserPromptSubmit {
            fields.insert("prompt".into(), prompt.into());
        } else {
            fields.insert("agent_id".into(), self.run_id.to_string().into());
            fields.insert("agent_type".into(), name.clone().into());
        }
        self.tools_running += 1;
        self.tool_tasks.push(tokio::spawn(async move {
            let verdict = match lifecycle {
                Some(lifecycle) => lifecycle.run(event, &name, fields, call).await,
                None => crate::lifecycle::Verdict::default(),
            };
            let _ = me.cast(AgentMsg::StartHooksDone(Box::new(verdict)));
        }));
    }

    /// Seals the run's worktree in a task (git's work never runs in the
    /// handler); the report comes back as `WorktreeSealed`.
    pub(super) fn seal_worktree(&mut self, myself: &ActorRef<AgentMsg>) {
        let seal = self.workspace.clone().and_then(|w| w.seal());
        let me = myself.clone();
        self.tools_running += 1;
        // Detached, not one of the step's tasks: a seal that started ends
        // whole (git killed mid-commit would leave its lock behind), even
        // if the run is cancelled meanwhile; its report then goes nowhere.
        tokio::spawn(async move {
            let report = match seal {
                Some(seal) => seal.await.map(Box::new),
                None => None,
            };
            let _ = me.cast(AgentMsg::WorktreeSealed(report));
        });
    }

    /// Gives the live slot back while children run.
    pub(super) fn suspend(&mut self) {
        if matches!(self.phase, Phase::Running) {
            self.phase = Phase::Suspended { parked: None };
            // Announce before the slot is released, so no agent taking it is seen
            // starting while this one still counts as live.
            self.emit(EventKind::Suspended);
            self.slot = None;
        }
    }

    pub(super) fn resume(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        permit: Option<Slot>,
    ) -> Vec<Action> {
        if matches!(self.phase, Phase::Finished) || self.machine.state().status.is_final() {
            return Vec::new();
        }
        self.slot = permit;
        let parked = match std::mem::replace(&mut self.phase, Phase::Running) {
            Phase::Suspended { parked } => parked,
            Phase::Running | Phase::Finished => None,
        };
        self.emit(EventKind::Resumed);
        match parked.map(|work| *work) {
            // (A slot that came while it waits for budget, asked for before
            // it paused, tries the step again as a raise would.)
            Some(Parked::Request(request) | Parked::Budget(request)) => {
                self.send_model(myself, request)
            }
            Some(Parked::Actions(actions)) => return actions,
            None => {}
        }
        Vec::new()
    }
}

/// What `PostToolUse` hooks give the model beside a result: their context,
/// a block's reason, or why they stopped the agent.
fn post_note(verdict: &crate::lifecycle::Verdict) -> Option<String> {
    let mut note = verdict.note_for_model();
    if let Some(stop) = &verdict.stop {
        let stop = format!("A hook asks you to stop: {stop}");
        note = Some(note.map_or(stop.clone(), |n| format!("{n}\n{stop}")));
    }
    note
}

/// Marks `span` failed, as the OpenTelemetry conventions say: status
/// ERROR with the message, and `error.type` the failure's kind
/// (`model_rate_limited`, …). The span must declare the three fields.
pub(super) fn mark_failed(span: &tracing::Span, kind: &str, message: &str) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", kind);
    span.record("otel.status_description", message);
}

/// [`mark_failed`] on the current span (a model call's), passing `failure` on.
pub(super) fn failed_span(failure: Failure) -> Failure {
    mark_failed(
        &tracing::Span::current(),
        failure.kind.name(),
        &failure.message,
    );
    failure
}

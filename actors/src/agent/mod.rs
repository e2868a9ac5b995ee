//! The agent actor: drives one run's `StepMachine`. Its handlers never await a
//! model call, a tool or a child: they start the work in a task, and the result
//! comes back as an `AgentMsg`, so `Cancel` and `Status` are served at any time.

mod approvals;
mod children;
mod idle;
mod msg;
mod timer;
mod work;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::event::EventKind;
use crate::failure::{Failure, FailureKind};
use crate::hooks::{Slot, TreeHooks};
use crate::id::RunId;
use crate::model::ModelRequest;
use crate::state::{AgentState, AgentStatus};
use crate::step::{Action, Catalog, EndSeal, StepMachine};
use crate::supervision;
use crate::template::AgentTemplate;

pub use crate::supervision::{CancelReason, ChildKey, RunResult};
use children::ChildActors;
pub use msg::{AgentArgs, AgentMsg, AgentSnapshot, Reply, ToolOutcome};
use work::mark_failed;

/// The ractor actor of one agent run (its state is an `AgentRun`).
pub struct AgentActor;

/// Where a run is, as far as its actor is concerned (how the machine stands is
/// the machine's: a run whose machine is done but has children out still runs).
enum Phase {
    /// It steps, in its live slot (if live agents are limited).
    Running,
    /// It gave its live slot back while its children run or its calls wait
    /// for approval; `parked` is work that waits for a slot again.
    /// Boxed: most agents never park, and a `ModelRequest` inline made every
    /// actor's state ~270 bytes larger (issue 17).
    Suspended { parked: Option<Box<Parked>> },
    /// Its result is out: the actor stops.
    Finished,
}

/// Work a suspended agent does once it holds a live slot again.
enum Parked {
    /// The next step's model request.
    Request(ModelRequest),
    /// A step's calls, let go by their approvals.
    Actions(Vec<Action>),
    /// A step its tree's budget could not admit: it waits for the budget
    /// to be raised (`BudgetRaised`), then for a slot.
    Budget(ModelRequest),
}

/// The actor's state: the machine plus the work in flight.
pub struct AgentRun {
    myself: ActorRef<AgentMsg>,
    hooks: Arc<dyn TreeHooks>,
    /// Where its tools work ([`AgentArgs::workspace`]).
    workspace: Option<Arc<dyn crate::tool::Workspace>>,
    machine: Box<StepMachine>,
    reply: Option<Reply>,
    slot: Option<Slot>,
    run_id: RunId,
    span: tracing::Span,
    model_task: Option<JoinHandle<()>>,
    tool_tasks: Vec<JoinHandle<()>>,
    /// Tool tasks of the current step not yet reported.
    tools_running: usize,
    /// The step timeout (`step_timeout`).
    timer: timer::Timer,
    /// The `approval_timeout` timer of the step whose calls wait.
    approval_timer: timer::Timer,
    /// The `idle_timeout` watchdog (`None`: the template has none).
    idle: Option<idle::IdleWatch>,
    phase: Phase,
    /// Tokens reserved against the tree's budget for the model call in flight.
    reserved: u64,
    cancel: CancelSignal,
    /// The child table, made by the first spawn: a leaf (most agents)
    /// never has one (issue 17: 368 bytes of every leaf's actor state).
    children: Option<Box<ChildActors>>,
    cancel_reason: Option<CancelReason>,
    /// The state once the run is over (the machine no longer holds it).
    final_state: Option<Arc<AgentState>>,
    result: Option<RunResult>,
    _live: LiveGuard,
}

impl AgentRun {
    /// Takes the result out of a child's final actor state.
    pub(crate) fn take_result(&mut self) -> Option<(ChildKey, RunResult)> {
        let key = match self.reply.as_ref()? {
            Reply::Parent(key) => *key,
            Reply::Root(_) => return None,
        };
        Some((key, self.result.take()?))
    }
}

/// If an actor dies without finishing (a panic outside the guarded step code, a
/// kill), its work in flight is stopped and its token reservation given back.
impl Drop for AgentRun {
    fn drop(&mut self) {
        if let Some(task) = self.model_task.take() {
            task.abort();
        }
        for task in self.tool_tasks.drain(..) {
            task.abort();
        }
        self.stop_timer();
        self.stop_approval_timer();
        self.release_reservation();
        self.cancel.cancel();
    }
}

/// Tells the agent's tasks (a launch, a wait for a slot) that the run is
/// over. The `watch` channel behind it is made by the first task that
/// listens: a leaf never starts one (issue 17: ~400 bytes per leaf).
#[derive(Default)]
struct CancelSignal {
    tx: Option<watch::Sender<bool>>,
    cancelled: bool,
}

impl CancelSignal {
    /// A receiver that sees `true` once the run is cancelled (at once if it is).
    fn subscribe(&mut self) -> watch::Receiver<bool> {
        let cancelled = self.cancelled;
        self.tx
            .get_or_insert_with(|| watch::channel(cancelled).0)
            .subscribe()
    }

    fn cancel(&mut self) {
        self.cancelled = true;
        if let Some(tx) = &self.tx {
            tx.send_replace(true);
        }
    }
}

struct LiveGuard(Arc<dyn TreeHooks>, RunId);

/// An id as a span field: itself, or `-` when there is none.
struct OrDash<'a, T>(Option<&'a T>);

impl<T: std::fmt::Display> std::fmt::Display for OrDash<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(id) => id.fmt(f),
            None => f.write_str("-"),
        }
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.actor_stopped(&self.1);
    }
}

struct HookCatalog<'a>(&'a dyn TreeHooks);

impl Catalog for HookCatalog<'_> {
    fn template(&self, id: &str) -> Option<Arc<AgentTemplate>> {
        self.0.template(id)
    }
    fn knows_agent(&self, requested: &str) -> bool {
        self.0.knows_agent(requested)
    }
    fn always_allowed(&self, tool: &str) -> bool {
        self.0.always_allowed(tool)
    }
    fn hooks_at(&self, event: crate::lifecycle::HookEvent, agent_type: &str) -> bool {
        self.0
            .lifecycle()
            .is_some_and(|l| l.wants(event, agent_type))
    }
    fn hooks_before(&self, tool: &str, agent_type: &str) -> bool {
        self.0.lifecycle().is_some_and(|l| {
            l.wants_tool(crate::lifecycle::HookEvent::PreToolUse, tool, agent_type)
        })
    }
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        // Not a string: nothing of it can be shown.
        "Unknown error".to_owned()
    }
}

impl Actor for AgentActor {
    type Msg = AgentMsg;
    type State = AgentRun;
    type Arguments = AgentArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<AgentMsg>,
        args: AgentArgs,
    ) -> Result<AgentRun, ActorProcessingErr> {
        let AgentArgs {
            hooks,
            mut machine,
            reply,
            slot,
            parent_span,
            workspace,
        } = args;
        machine.set_checkpointing(hooks.durable());
        let state = machine.state();
        let run_id = state.run_id.clone();
        hooks.actor_started(&run_id, &myself.get_cell());
        // The agent exists from here (its state is built, its actor
        // registered), whether or not the runtime has polled it yet: a
        // consumer counting agents alive counts it now.
        hooks.emit(
            &run_id,
            EventKind::AgentStarted {
                agent_id: state.agent_id.clone(),
                agent_type: state.agent_type.clone().unwrap_or_default(),
                parent_run_id: state.parent_run_id().cloned(),
                depth: state.depth(),
            },
        );
        // OpenTelemetry GenAI semantic conventions: `invoke_agent {agent}`.
        let agent_type = state.agent_type.as_deref().unwrap_or("-");
        let span = tracing::info_span!(
            parent: &parent_span,
            "agent",
            otel.name = format!("invoke_agent {agent_type}").as_str(),
            gen_ai.operation.name = "invoke_agent",
            gen_ai.agent.name = machine.template().display_name.as_str(),
            gen_ai.agent.id = %state.run_id,
            run_id = %state.run_id,
            parent_id = %OrDash(state.parent_id.as_ref()),
            agent_type,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        Ok(AgentRun {
            myself,
            _live: LiveGuard(hooks.clone(), run_id.clone()),
            idle: idle::IdleWatch::new(machine.template().idle_timeout),
            hooks,
            workspace,
            machine,
            reply: Some(reply),
            slot,
            run_id,
            span,
            model_task: None,
            tool_tasks: Vec::new(),
            tools_running: 0,
            timer: timer::Timer::default(),
            approval_timer: timer::Timer::default(),
            phase: Phase::Running,
            reserved: 0,
            cancel: CancelSignal::default(),
            children: None,
            cancel_reason: None,
            final_state: None,
            result: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<AgentMsg>,
        run: &mut AgentRun,
    ) -> Result<(), ActorProcessingErr> {
        let hooks = run.hooks.clone();
        let steers = hooks.steers(&run.run_id);
        if !steers.is_empty() {
            run.machine.recover_steers(steers);
        }
        let deliveries = hooks.deliveries(&run.run_id);
        if !deliveries.is_empty() {
            run.machine.recover_deliveries(deliveries);
        }
        let decisions = hooks.decisions(&run.run_id);
        if !decisions.is_empty() {
            run.machine.recover_decisions(decisions);
        }
        let verdicts = hooks.hook_verdicts(&run.run_id);
        if !verdicts.is_empty() {
            run.machine.recover_hook_verdicts(verdicts);
        }
        if run.machine.template().handler.is_some()
            && let Some(record) = hooks.program_record(&run.run_id)
        {
            run.machine.recover_program(record);
        }
        let compactions = hooks.compactions(&run.run_id);
        if !compactions.is_empty() {
            run.machine.recover_compactions(compactions);
        }
        if let Some(report) = hooks.worktree_report(&run.run_id) {
            run.machine.recover_worktree(report);
        }
        let actions = run.guarded(|m| m.start(&HookCatalog(hooks.as_ref())));
        run.execute(&myself, actions);
        // A run can end before its first message (a refused first step).
        run.maybe_finish(&myself);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<AgentMsg>,
        msg: AgentMsg,
        run: &mut AgentRun,
    ) -> Result<(), ActorProcessingErr> {
        let hooks = run.hooks.clone();
        let catalog = HookCatalog(hooks.as_ref());
        let actions = match msg {
            AgentMsg::ModelDone { step, result } => {
                run.model_task = None;
                run.stop_timer();
                match *result {
                    Ok(response) => {
                        let reserved = std::mem::take(&mut run.reserved);
                        // A reply without usage still spent about what was sent.
                        let mut usage = response.usage;
                        if usage.total_tokens() == 0 {
                            usage.input_tokens = reserved;
                        }
                        run.hooks.settle(&usage, reserved);
                        run.guarded(|m| m.model_replied(step, response, &catalog))
                    }
                    Err((error, None)) => {
                        run.release_reservation();
                        run.machine.model_failed(step, error, None)
                    }
                    // A reply came and is not acted on: billed all the same.
                    Err((error, Some(mut billed))) => {
                        let reserved = std::mem::take(&mut run.reserved);
                        if billed.total_tokens() == 0 {
                            billed.input_tokens = reserved;
                        }
                        run.hooks.settle(&billed, reserved);
                        run.machine.model_failed(step, error, Some(billed))
                    }
                }
            }
            AgentMsg::StopHooksDone { step, verdict } => {
                run.tools_running = run.tools_running.saturating_sub(1);
                run.guarded(|m| m.stop_hooks_done(step, *verdict))
            }
            AgentMsg::StartHooksDone(verdict) => {
                run.tools_running = run.tools_running.saturating_sub(1);
                run.guarded(|m| m.start_hooks_done(*verdict, &catalog))
            }
            AgentMsg::WorktreeSealed(report) => {
                run.tools_running = run.tools_running.saturating_sub(1);
                run.guarded(|m| m.worktree_sealed(report.map(|r| *r)))
            }
            AgentMsg::HooksDone { step, verdicts } => {
                run.tools_running = run.tools_running.saturating_sub(1);
                run.guarded(|m| m.hooks_done(step, *verdicts, &catalog))
            }
            AgentMsg::ToolDone {
                step,
                index,
                outcome,
                post,
            } => {
                // `continue: false` from a PostToolUse hook stops the agent
                // once the call's result is in (Claude Code's contract).
                let mut stopped = None;
                if let Some(verdict) = post
                    && step == run.machine.step()
                {
                    stopped = verdict.stop.clone();
                    let call_id = run.machine.call_id(index).unwrap_or_default();
                    run.emit(EventKind::HookDecided {
                        step,
                        tool_call_id: call_id,
                        hook: crate::lifecycle::HookEvent::PostToolUse,
                        verdict: *verdict,
                    });
                }
                // The step timeout covers the step's tools, not the children a
                // spawn in the same step may still be waiting for.
                run.tools_running = run.tools_running.saturating_sub(1);
                if run.tools_running == 0 && run.model_task.is_none() {
                    run.stop_timer();
                    if run.awaited_children() > 0 {
                        run.suspend();
                    }
                }
                match *outcome {
                    // Stopped before the step goes on: no next model call,
                    // checkpoint or spawn for a run that ends here.
                    ToolOutcome::Done(_) if let Some(why) = stopped => {
                        run.machine.fail(Failure::new(
                            FailureKind::Blocked,
                            format!("a PostToolUse hook stopped the agent: {why}"),
                        ))
                    }
                    ToolOutcome::Done(result) => {
                        run.guarded(|m| m.tool_done(step, index, result, &catalog))
                    }
                    ToolOutcome::Panicked(error) if step == run.machine.step() => run.machine.fail(
                        Failure::new(FailureKind::Panicked, format!("a tool panicked: {error}")),
                    ),
                    ToolOutcome::Panicked(_) => Vec::new(),
                }
            }
            AgentMsg::ChildStarted { key, actor } => run.child_started(key, actor),
            AgentMsg::ChildNotStarted { key, error } => {
                run.feed(supervision::Input::NotStarted { key, error })
            }
            AgentMsg::ChildRecovered { key, result } => run.feed(supervision::Input::Recovered {
                key,
                result: *result,
            }),
            AgentMsg::RetryDue { key } => run.retry_due(key),
            AgentMsg::SlotReady(permit) => run.resume(&myself, permit),
            AgentMsg::StoreReady(request) => {
                // A run cancelled while it waited has nothing to send.
                if !run.machine.state().status.is_final() {
                    run.send_model(&myself, *request);
                }
                Vec::new()
            }
            AgentMsg::StepTimeout { step, generation } => run.step_timeout(step, generation),
            AgentMsg::ApprovalTimeout { step, generation } => {
                run.approval_timeout(&myself, step, generation, &catalog)
            }
            AgentMsg::IdleCheck { generation } => run.idle_check(&myself, generation),
            AgentMsg::Cancel(reason) => run.cancel(reason),
            AgentMsg::CancelChild { run_id } => run.feed(supervision::Input::Cancel { run_id }),
            AgentMsg::Decide {
                call_id,
                decision,
                reply,
            } => match run.machine.decide(&call_id, *decision, &catalog) {
                Ok(actions) => {
                    let _ = reply.send(Ok(()));
                    run.decided(&myself, actions)
                }
                Err(refused) => {
                    let _ = reply.send(Err(refused));
                    Vec::new()
                }
            },
            AgentMsg::BudgetRaised => {
                if let Phase::Suspended { parked } = &mut run.phase
                    && let Some(Parked::Budget(request)) = parked
                        .take_if(|work| matches!(**work, Parked::Budget(_)))
                        .map(|work| *work)
                {
                    run.park(&myself, Parked::Request(request));
                }
                Vec::new()
            }
            AgentMsg::Steer {
                text,
                limits,
                reply,
            } => {
                let _ = reply.send(run.machine.steer_within(text, &limits));
                Vec::new()
            }
            AgentMsg::Status(reply) => {
                let state = match &run.final_state {
                    Some(state) => AgentState::clone(state),
                    None => run.machine.state().clone(),
                };
                let _ = reply.send(AgentSnapshot {
                    state,
                    step: run.machine.step(),
                    live_children: run.live_children(),
                });
                Vec::new()
            }
        };
        run.execute(&myself, actions);
        run.maybe_finish(&myself);
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<AgentMsg>,
        event: SupervisionEvent,
        run: &mut AgentRun,
    ) -> Result<(), ActorProcessingErr> {
        let actions = match event {
            SupervisionEvent::ActorTerminated(cell, Some(mut boxed), _) => {
                match boxed
                    .take::<AgentRun>()
                    .ok()
                    .and_then(|mut child| child.take_result())
                {
                    Some((key, result)) => run.child_ended(cell.get_id(), key, result),
                    None => run.child_lost(cell.get_id(), "agent stopped without a result".into()),
                }
            }
            SupervisionEvent::ActorTerminated(cell, None, reason) => run.child_lost(
                cell.get_id(),
                format!("agent was killed ({})", reason.unwrap_or_default()),
            ),
            SupervisionEvent::ActorFailed(cell, error) => {
                run.child_lost(cell.get_id(), format!("agent panicked: {error}"))
            }
            _ => Vec::new(),
        };
        run.execute(&myself, actions);
        run.maybe_finish(&myself);
        Ok(())
    }
}

impl AgentRun {
    /// Runs machine code, turning a panic (e.g. in a step handler) into a failure.
    fn guarded(&mut self, f: impl FnOnce(&mut StepMachine) -> Vec<Action>) -> Vec<Action> {
        match std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut self.machine))) {
            Ok(actions) => actions,
            Err(panic) => self.machine.fail(Failure::new(
                FailureKind::Panicked,
                format!("agent panicked: {}", panic_message(panic)),
            )),
        }
    }

    fn emit(&self, kind: EventKind) {
        // Progress is the run's own work (semantics §11): what a person said
        // or decided, and the waits around it, are not.
        let own_work = !matches!(
            kind,
            EventKind::Steered { .. }
                | EventKind::ApprovalRequested { .. }
                | EventKind::ApprovalDecided { .. }
                | EventKind::BudgetReached { .. }
                | EventKind::LimitsRaised { .. }
                | EventKind::Suspended
                | EventKind::Resumed
        );
        if own_work && self.idle.is_some() {
            self.touch_progress();
        }
        self.hooks.emit(&self.run_id, kind);
    }

    fn execute(&mut self, myself: &ActorRef<AgentMsg>, mut actions: Vec<Action>) {
        for event in self.machine.take_events() {
            self.emit(event);
        }
        // Tools start before the step's spawns, so the agent keeps its live slot
        // until they are done (a stable sort keeps call order otherwise).
        actions.sort_by_key(|a| !matches!(a, Action::RunTool { .. }));
        for action in actions {
            match action {
                Action::CallModel(request) => self.call_model(myself, request),
                // Its calls wait for a person: the slot is not needed meanwhile.
                Action::AwaitApproval => {
                    self.start_approval_timer(myself);
                    if self.tools_running == 0 && self.model_task.is_none() {
                        self.suspend();
                    }
                }
                Action::RunTool {
                    step,
                    index,
                    call_id,
                    tool,
                    input,
                } => self.run_tool(myself, step, index, call_id, tool, input),
                Action::RunHooks { step, calls } => self.run_hooks(myself, step, calls),
                Action::SealWorktree => self.seal_worktree(myself),
                Action::RunStartHooks { event, prompt } => {
                    self.run_start_hooks(myself, event, prompt)
                }
                Action::RunStopHooks {
                    step,
                    event,
                    last_message,
                    active,
                } => self.run_stop_hooks(myself, step, event, last_message, active),
                Action::SpawnAgents {
                    step,
                    index,
                    children,
                } => {
                    let actions = self.spawn_agents(step, index, children);
                    self.execute(myself, actions);
                }
                Action::SpawnInline { step, index, child } => {
                    let actions = self.spawn_inline(step, index, child);
                    self.execute(myself, actions);
                }
                Action::SpawnBackground {
                    step,
                    index,
                    children,
                } => {
                    let actions = self.spawn_background(step, index, children);
                    self.execute(myself, actions);
                }
                Action::Relaunch { children } => {
                    let actions = self.relaunch(children);
                    self.execute(myself, actions);
                }
                // The turn waits for background reports: no slot is needed meanwhile.
                Action::AwaitChildren => {
                    if self.tools_running == 0 && self.model_task.is_none() {
                        self.suspend();
                    }
                }
                Action::Finish => {
                    let actions = self.finish_requested();
                    self.execute(myself, actions);
                }
            }
        }
        for event in self.machine.take_events() {
            self.emit(event);
        }
    }

    fn cancel(&mut self, reason: CancelReason) -> Vec<Action> {
        if self.machine.state().status.is_final() {
            return Vec::new();
        }
        self.cancel_reason = Some(reason.clone());
        match reason {
            CancelReason::Limit(limit) => self.machine.fail(limit),
            CancelReason::Failed(failure) => self.machine.fail(failure),
            CancelReason::Requested | CancelReason::ParentEnded => self.machine.cancel(),
        }
    }

    /// The machine is done: stop the work in flight, end the children, then finish.
    fn finish_requested(&mut self) -> Vec<Action> {
        if let Some(task) = self.model_task.take() {
            task.abort();
        }
        for task in self.tool_tasks.drain(..) {
            task.abort();
        }
        self.stop_timer();
        self.stop_approval_timer();
        if let Phase::Suspended { parked } = &mut self.phase {
            *parked = None;
        }
        self.release_reservation();
        self.cancel.cancel();
        self.feed(supervision::Input::ParentEnded {
            cancelled: self.cancel_reason.clone(),
        })
    }

    /// Finishes once the machine is done and no child is left.
    fn maybe_finish(&mut self, myself: &ActorRef<AgentMsg>) {
        if matches!(self.phase, Phase::Finished)
            || !self.machine.state().status.is_final()
            || self.outstanding_children() > 0
        {
            return;
        }
        match self.machine.end_seal() {
            EndSeal::Done => {}
            EndSeal::Start => return self.seal_worktree(myself),
            EndSeal::Wait => return,
        }
        self.phase = Phase::Finished;
        let late = self.undelivered_children();
        self.machine.close_children(late);
        let value = self.machine.output_value();
        // The run is over: its state moves out of the machine (no copy) and is
        // shared by the final event and the result.
        let state = Arc::new(self.machine.take_state());
        self.final_state = Some(state.clone());
        let shared = state.clone();
        let inherited = self.machine.inherited();
        self.emit(match state.status {
            AgentStatus::Completed | AgentStatus::Running => EventKind::AgentFinished {
                state: shared,
                inherited,
            },
            AgentStatus::Failed => {
                let error = state.error_message().unwrap_or("failed").to_owned();
                let kind = state.error_kind.map_or("_OTHER", |kind| kind.name());
                mark_failed(&self.span, kind, &error);
                EventKind::AgentFailed {
                    error,
                    state: shared,
                    inherited,
                }
            }
            AgentStatus::Cancelled => EventKind::AgentCancelled {
                state: shared,
                inherited,
            },
        });
        // Only now that the end is announced may another agent take the slot.
        self.slot = None;
        let result = RunResult { state, value };
        match self.reply.as_mut() {
            Some(Reply::Root(_)) => {
                if let Some(Reply::Root(tx)) = self.reply.take() {
                    let _ = tx.send(result);
                }
            }
            Some(Reply::Parent(_)) => self.result = Some(result),
            None => {}
        }
        myself.stop(None);
    }
}

#[cfg(test)]
mod panic_tests {
    use super::panic_message;

    #[test]
    fn a_panic_with_a_non_string_payload_reads_unknown_error() {
        let payload = std::panic::catch_unwind(|| std::panic::panic_any(42_u8)).unwrap_err();
        assert_eq!(panic_message(payload), "Unknown error");
        let payload = std::panic::catch_unwind(|| panic!("bomb {}", 1)).unwrap_err();
        assert_eq!(panic_message(payload), "bomb 1");
    }
}

#[cfg(test)]
mod size_tests {
    use super::{AgentRun, CancelSignal, Phase};

    /// The cancel signal's channel is made by the first task that listens,
    /// so a task that starts listening after the cancel must still see it.
    #[test]
    fn a_task_that_listens_after_the_cancel_sees_it_at_once() {
        let mut late = CancelSignal::default();
        late.cancel();
        assert!(*late.subscribe().borrow());
        let mut early = CancelSignal::default();
        let mut rx = early.subscribe();
        assert!(!*rx.borrow_and_update());
        early.cancel();
        assert!(rx.has_changed().unwrap());
        assert!(*rx.borrow());
    }

    /// ractor boxes every message at the enum's size, and the actor's task
    /// holds one: a tool's outcome and a person's decision held inline made
    /// every message 120 bytes (issue 17); boxed, 56.
    #[test]
    fn an_agent_message_holds_no_tool_outcome_nor_decision_inline() {
        let msg = size_of::<super::AgentMsg>();
        assert!(
            msg <= 64,
            "AgentMsg is {msg} bytes (56 when this test was written)"
        );
    }

    /// Every agent in memory holds one `AgentRun` (issue 17: bytes per live
    /// agent). A parked `ModelRequest` held inline made every actor's state
    /// 280 bytes larger although most agents never park (1,104 bytes), and
    /// the child table held inline made every leaf carry one (824 bytes);
    /// now 472. Sizes, not timings: this cannot flake.
    #[test]
    fn an_agents_actor_state_holds_no_parked_request_nor_child_table_inline() {
        assert!(
            size_of::<Phase>() <= 16,
            "Phase is {} bytes",
            size_of::<Phase>()
        );
        let run = size_of::<AgentRun>();
        assert!(
            run <= 520,
            "AgentRun is {run} bytes (472 when this test was written)"
        );
    }

    /// The same for the step machine every agent boxes: a step's pending
    /// calls (320 bytes) held inline made every machine hold their room,
    /// although a leaf that answers in text never has any (1,152 bytes); so
    /// did steers, recorded decisions and background children, which most
    /// runs never see (840 bytes). Now 680.
    #[test]
    fn a_step_machine_holds_no_pending_calls_nor_sideband_inline() {
        let machine = size_of::<crate::step::StepMachine>();
        assert!(
            machine <= 720,
            "StepMachine is {machine} bytes (680 when this test was written)"
        );
    }
}

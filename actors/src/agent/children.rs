//! The driver of a parent's child table ([`crate::supervision::Children`]):
//! it lends the table's admission ([`crate::supervision::admit`]) the tree's
//! toolboxes and limits, feeds the table what happens to the children, and
//! carries out what the table answers (start children in live slots, retry
//! timers, cancels, events, delivery to the machine). Every decision is the
//! table's.

use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt;
use ractor::{Actor, ActorId, ActorRef};
use tokio::sync::Notify;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;

use super::{AgentActor, AgentArgs, AgentMsg, AgentRun, Reply, RunResult};
use crate::checkpoint::{Checkpoint, Recovered};
use crate::event::EventKind;
use crate::history::History;
use crate::id::{AgentId, RunId};
use crate::idmap::{IdMap, IdSet};
use crate::output::output_value;
use crate::spawn::{ChildPlan, ParentInfo, SpawnChildren};
use crate::state::AgentState;
use crate::step::background::Started;
use crate::step::{Action, StepMachine};
use crate::supervision::{
    Admission, ChildKey, Children, Delivery, Input, Launch, Output, Start, admit,
};
use crate::toolbox::Toolbox;

/// A state read back from a store, its history sharing the live `snapshot`'s
/// messages again: an inline child's history becomes its parent's, which tells
/// its own messages by address.
fn shared_with(state: &AgentState, snapshot: &History) -> AgentState {
    AgentState {
        message_history: state.message_history.sharing_prefix_with(snapshot),
        ..state.clone()
    }
}

/// The child table and what the driver needs to carry out its outputs.
#[derive(Default)]
pub(super) struct ChildActors {
    table: Children<ActorId>,
    /// The running children's actors, by the id the table knows them by.
    actors: IdMap<ActorId, ActorRef<AgentMsg>>,
    retry_timers: IdMap<ChildKey, JoinHandle<()>>,
    /// The launches that wait for more of their call's children, by call.
    streams: IdMap<(u32, usize), UnboundedSender<Start>>,
    /// Run ids of children cancelled before they started: the launch task
    /// skips them. Made by the first launch: a leaf, most agents, never
    /// needs one (two allocations per agent, issue 17).
    skip: Option<Arc<SkipList>>,
}

/// The run ids a launch task skips, and a wake-up for one that waits for
/// a slot when an id is added.
#[derive(Default)]
struct SkipList {
    ids: Mutex<IdSet<RunId>>,
    changed: Notify,
}

impl AgentRun {
    /// The child table, made now if this is the agent's first spawn.
    fn children_mut(&mut self) -> &mut ChildActors {
        self.children.get_or_insert_default()
    }

    /// Children whose actor runs.
    pub(super) fn live_children(&self) -> usize {
        self.children.as_ref().map_or(0, |c| c.table.live_count())
    }

    /// Children that have not reported yet (starting, running or waiting to retry).
    pub(super) fn outstanding_children(&self) -> usize {
        self.children.as_ref().map_or(0, |c| c.table.outstanding())
    }

    /// Children of calls the parent waits for (not background ones) not yet reported.
    pub(super) fn awaited_children(&self) -> usize {
        self.children.as_ref().map_or(0, |c| c.table.awaited())
    }

    /// Call index, credits and run ids of the calls never handed to the machine.
    pub(super) fn undelivered_children(&self) -> Vec<(usize, f64, Vec<RunId>)> {
        self.children
            .as_ref()
            .map_or_else(Vec::new, |c| c.table.undelivered())
    }

    /// Admits the children of a `spawn_agents` call (the table decides,
    /// [`admit::admit_planned`]): each is counted and given its ordinal now,
    /// and waits as those numbers until it comes up (its plan is made then,
    /// from its entry in the call).
    pub(super) fn spawn_agents(
        &mut self,
        step: u32,
        index: usize,
        children: SpawnChildren,
    ) -> Vec<Action> {
        let parent_run = self.machine.state().run_id.clone();
        let mut tree = HookTree::new(self);
        let next = self.machine.children_spawned() + 1;
        let (admitted, planner, count) =
            admit::admit_planned(children, &parent_run, next, &mut tree);
        self.admitted(tree, count);
        self.open_call(step, index, false, admitted, Some(planner))
    }

    /// Children planned in full, admitted as [`admit::admit_each`] decides.
    fn admit_each(&mut self, children: Vec<crate::step::Planned>) -> Vec<Admission> {
        let parent_run = self.machine.state().run_id.clone();
        let mut tree = HookTree::new(self);
        let next = self.machine.children_spawned() + 1;
        let (admitted, count) = admit::admit_each(children, &parent_run, next, &mut tree);
        self.admitted(tree, count);
        admitted
    }

    /// After an admission: the limits it hit are events, and the machine
    /// counts the `count` children admitted.
    fn admitted(&mut self, tree: HookTree, count: u32) {
        for limit in tree.hit {
            self.emit(EventKind::LimitHit { limit });
        }
        for _ in 0..count {
            self.machine.next_child_ordinal();
        }
    }

    pub(super) fn spawn_inline(
        &mut self,
        step: u32,
        index: usize,
        child: ChildPlan,
    ) -> Vec<Action> {
        let children = self.admit_each(vec![Ok(child)]);
        self.open_call(step, index, true, children, None)
    }

    /// Starts the children of a `spawn_agents_async` call: admitted like
    /// `spawn_agents`' children, they run while the parent goes on, and the
    /// call's result (their run ids) is the machine's at once.
    pub(super) fn spawn_background(
        &mut self,
        step: u32,
        index: usize,
        children: Vec<Result<ChildPlan, (String, String)>>,
    ) -> Vec<Action> {
        let children = self.admit_each(children);
        let started = children
            .iter()
            .map(|child| match child {
                Admission::Refused { agent_type, error } => Started::Refused {
                    agent_type: agent_type.clone(),
                    error: error.clone(),
                },
                Admission::Admitted { plan, id, .. } => Started::Running {
                    agent_id: AgentId::from_run(id.clone()),
                    run_id: id.clone(),
                    agent_type: plan.agent_type.to_string(),
                    agent_name: plan.template.display_name.clone(),
                },
                // `admit` makes no waiting children: a background call is planned in full.
                Admission::Waiting { .. } => Started::Refused {
                    agent_type: String::new(),
                    error: "internal: a background child was not planned".to_owned(),
                },
            })
            .collect();
        let hooks = self.hooks.clone();
        let catalog = super::HookCatalog(hooks.as_ref());
        // The machine knows the children before any of them can report.
        let mut actions = self.guarded(|m| m.background_started(step, index, started, &catalog));
        let parent = Arc::new(ParentInfo::of(self.machine.state(), self.machine.toolbox()));
        actions.extend(self.feed(Input::Open {
            step,
            call: index,
            inline: false,
            background: true,
            parent,
            children,
            planner: None,
        }));
        actions
    }

    /// Starts again the background children a run going on from its
    /// checkpoint still waits for, under the ids they were started with
    /// (semantics §15). They were admitted when they were first started, so
    /// they are not counted again; one that finished before is merged from
    /// the store, one cut short goes on from its own checkpoint.
    pub(super) fn relaunch(
        &mut self,
        children: Vec<(AgentId, crate::step::Planned)>,
    ) -> Vec<Action> {
        let mut admitted = Vec::new();
        let mut failed = Vec::new();
        for (agent_id, plan) in children {
            let planned = plan.and_then(|plan| {
                let id = agent_id.as_run().clone();
                let toolbox = self
                    .hooks
                    .toolbox(&plan.template)
                    .map_err(|e| (plan.agent_type.to_string(), e.to_string()))?;
                Ok(Admission::Admitted { plan, toolbox, id })
            });
            match planned {
                Ok(admission) => admitted.push(admission),
                Err((agent_type, error)) => {
                    let mut report = crate::spawn::ChildReport::refused(
                        &agent_type,
                        &format!("could not be started again: {error}"),
                    );
                    report.agent_id = Some(agent_id);
                    failed.push(report);
                }
            }
        }
        let mut actions = Vec::new();
        for report in failed {
            actions.extend(self.machine.background_reported(report));
        }
        if !admitted.is_empty() {
            let parent = Arc::new(ParentInfo::of(self.machine.state(), self.machine.toolbox()));
            // Step 0 is never a step of the run: these keys meet no call's.
            actions.extend(self.feed(Input::Open {
                step: 0,
                call: 0,
                inline: false,
                background: true,
                parent,
                children: admitted,
                planner: None,
            }));
        }
        actions
    }

    fn open_call(
        &mut self,
        step: u32,
        call: usize,
        inline: bool,
        children: Vec<Admission>,
        planner: Option<crate::supervision::Planner>,
    ) -> Vec<Action> {
        let parent = Arc::new(ParentInfo::of(self.machine.state(), self.machine.toolbox()));
        self.feed(Input::Open {
            step,
            call,
            inline,
            background: false,
            parent,
            children,
            planner,
        })
    }

    pub(super) fn child_started(
        &mut self,
        key: ChildKey,
        actor: ActorRef<AgentMsg>,
    ) -> Vec<Action> {
        let id = actor.get_id();
        self.children_mut().actors.insert(id, actor);
        let actions = self.feed(Input::Started { key, actor: id });
        if !self.children_mut().table.is_live(&id) {
            self.children_mut().actors.remove(&id);
        }
        actions
    }

    /// A child's actor ended with its result.
    pub(super) fn child_ended(
        &mut self,
        id: ActorId,
        key: ChildKey,
        result: RunResult,
    ) -> Vec<Action> {
        self.children_mut().actors.remove(&id);
        self.feed(Input::Ended {
            key,
            actor: id,
            result,
        })
    }

    /// A child actor died without handing over a result (panic or kill).
    pub(super) fn child_lost(&mut self, id: ActorId, error: String) -> Vec<Action> {
        self.children_mut().actors.remove(&id);
        self.feed(Input::Lost { actor: id, error })
    }

    pub(super) fn retry_due(&mut self, key: ChildKey) -> Vec<Action> {
        self.children_mut().retry_timers.remove(&key);
        self.feed(Input::RetryDue { key })
    }

    /// Feeds the child table and carries out what it answers; returns the
    /// machine's actions (from a delivery or an escalation).
    pub(super) fn feed(&mut self, input: Input<ActorId>) -> Vec<Action> {
        // A run that never spawned has nothing for its end to stop; it
        // spawns nothing after it either (`Finish` is a final machine's
        // last action), so no table is made just to record it.
        if self.children.is_none() && matches!(input, Input::ParentEnded { .. }) {
            return Vec::new();
        }
        let mut actions = Vec::new();
        // Inputs that outputs make (children a launch no longer takes) are
        // taken in turn here, not by a call per child: a call of 10^4 whose
        // launch ended would nest that deep.
        let mut inputs = std::collections::VecDeque::from([input]);
        while let Some(input) = inputs.pop_front() {
            let ending = matches!(input, Input::ParentEnded { .. });
            let outputs = self.children_mut().table.handle(input);
            if ending {
                // No more children follow: the launches waiting for more end.
                self.children_mut().streams.clear();
            }
            actions.extend(self.carry_out(outputs, &mut inputs));
        }
        actions
    }

    /// Carries out the table's outputs; the inputs they make go to `inputs`.
    fn carry_out(
        &mut self,
        outputs: Vec<Output<ActorId>>,
        inputs: &mut std::collections::VecDeque<Input<ActorId>>,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        for output in outputs {
            match output {
                Output::Emit(kind) => self.emit(kind),
                // While the step's tools still run the agent keeps its slot; the
                // last one to report gives it back if children are still out.
                Output::Wait => {
                    if self.tools_running == 0 {
                        self.suspend();
                    }
                }
                Output::Launch(launch) => self.launch(launch),
                Output::More {
                    call,
                    children,
                    last,
                } => {
                    let streams = &mut self.children_mut().streams;
                    let unsent: Vec<ChildKey> = match streams.get(&call) {
                        Some(more) => children
                            .into_iter()
                            .filter_map(|start| more.send(start).err().map(|e| e.0.key))
                            .collect(),
                        None => children.into_iter().map(|start| start.key).collect(),
                    };
                    if last {
                        streams.remove(&call);
                    }
                    // The launch is over (its parent was cancelled): they never start.
                    for key in unsent {
                        let error = "cancelled before it started".to_owned();
                        inputs.push_back(Input::NotStarted { key, error });
                    }
                }
                Output::Skip { run_id } => {
                    let skip = self.children_mut().skip.get_or_insert_default();
                    skip.ids
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(run_id);
                    skip.changed.notify_waiters();
                }
                Output::Cancel { actor, reason } => {
                    if let Some(actor) = self.children_mut().actors.get(&actor) {
                        let _ = actor.cast(AgentMsg::Cancel(reason));
                    }
                }
                Output::Retry { key, delay } => {
                    let me = self.myself.clone();
                    let task = tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let _ = me.cast(AgentMsg::RetryDue { key });
                    });
                    self.children_mut().retry_timers.insert(key, task);
                }
                Output::StopRetry { key } => {
                    if let Some(task) = self.children_mut().retry_timers.remove(&key) {
                        task.abort();
                    }
                }
                Output::Deliver(delivery) => actions.extend(self.deliver(delivery)),
                Output::Report(report) => {
                    actions.extend(self.guarded(|m| m.background_reported(*report)))
                }
                Output::Fail { failure } => actions.extend(self.machine.fail(failure)),
            }
        }
        actions
    }

    fn deliver(&mut self, delivery: Delivery) -> Vec<Action> {
        let Delivery {
            step,
            call,
            inline,
            reports,
        } = delivery;
        let hooks = self.hooks.clone();
        let catalog = super::HookCatalog(hooks.as_ref());
        if inline {
            let Some(report) = reports.into_iter().next() else {
                return Vec::new();
            };
            self.guarded(|m| m.inline_done(step, call, report, &catalog))
        } else {
            self.guarded(|m| m.spawn_done(step, call, reports, &catalog))
        }
    }

    /// Starts children (attempts) of one spawn call: all join the line for a live
    /// slot at once; one task takes their slots in turn, builds each state, and spawns it linked to this
    /// actor. A slot that is free is taken at once, without setting up the
    /// wait for a cancel or a slot. (A task per child, tried to build children
    /// in parallel, measured no faster on the LLM-bound trees and held every
    /// child's start queued at once: 8 MB at the peak of the 11,111-agent tree.)
    fn launch(&mut self, launch: Launch) {
        let Launch {
            parent,
            priority,
            children,
            stream,
        } = launch;
        // A call's children after these come through `more`.
        let mut more: Option<UnboundedReceiver<Start>> = stream.map(|stream| {
            let (send, receive) = unbounded_channel();
            self.children_mut().streams.insert(stream.call, send);
            receive
        });
        let line_len = stream.map_or(children.len(), |s| s.line);
        let skip = self.children_mut().skip.get_or_insert_default().clone();
        let hooks = self.hooks.clone();
        let mut cancelled = self.cancel.subscribe();
        let me = self.myself.clone();
        // Each child's span is a child of this agent's: one trace per tree.
        let parent_span = self.span.clone();
        // A child works where its parent does, or in a worktree of its own.
        let workspace = self.workspace.clone();
        // Every child joins the line for a slot at once, in order, so a
        // parent's children are served one after another before the children
        // of a parent that launched later (see `Slots`). Joining child after
        // child let a freed slot go to a new, shallower agent whenever no
        // launch happened to be in line, and every new parent brought ten more
        // children: the 1.1 M-agent tree at 10,000 live held 17,000 alive.
        // The launch waits in line once, for all its children (see
        // `SlotLine`): a child waiting for its slot holds nothing of its own.
        let mut line = hooks.acquire_slots(priority, line_len);
        tokio::spawn(async move {
            let mut pending = children.into_iter();
            loop {
                let start = match pending.next() {
                    Some(start) => start,
                    None => match more.as_mut() {
                        // The parent drops its end when no more follow or it ends.
                        Some(receive) => match receive.recv().await {
                            Some(start) => start,
                            None => break,
                        },
                        None => break,
                    },
                };
                // The ids are made as the child comes up: a waiting child
                // holds none (issue 34).
                let ids = start.ids(&parent.run_id);
                let Start {
                    key, plan, toolbox, ..
                } = start;
                // A resumed tree merges a child that finished before, and lets
                // one that was cut short go on from its last checkpoint.
                let checkpoint = match hooks.recovered(&ids.run_id) {
                    Some(Recovered::Finished { state, inherited }) => {
                        let state = if plan.inline {
                            Arc::new(shared_with(&state, &plan.snapshot))
                        } else {
                            state
                        };
                        let value = output_value(&state, plan.template.output_mode, inherited);
                        let result = Box::new(RunResult { state, value });
                        let _ = me.cast(AgentMsg::ChildRecovered { key, result });
                        continue;
                    }
                    Some(Recovered::Checkpoint(checkpoint)) if plan.inline => {
                        Some(Arc::new(Checkpoint {
                            state: shared_with(&checkpoint.state, &plan.snapshot),
                            ..(*checkpoint).clone()
                        }))
                    }
                    Some(Recovered::Checkpoint(checkpoint)) => Some(checkpoint),
                    None => None,
                };
                let skipped = || {
                    skip.ids
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .contains(&ids.run_id)
                };
                // A free slot is taken at once: no wait to set up (a cancel or
                // skip is checked just below either way).
                let slot = match line.next().now_or_never() {
                    Some(slot) => Some(slot),
                    None => {
                        // Cancelled by its run id before it started: it never will.
                        let skip_wait = async {
                            loop {
                                let changed = skip.changed.notified();
                                tokio::pin!(changed);
                                changed.as_mut().enable();
                                if skipped() {
                                    return;
                                }
                                changed.await;
                            }
                        };
                        tokio::select! {
                            biased;
                            _ = cancelled.wait_for(|c| *c) => None,
                            () = skip_wait => {
                                let error = "cancelled before it started".to_owned();
                                let _ = me.cast(AgentMsg::ChildNotStarted { key, error });
                                continue;
                            }
                            slot = line.next() => Some(slot),
                        }
                    }
                };
                if skipped() {
                    let error = "cancelled before it started".to_owned();
                    let _ = me.cast(AgentMsg::ChildNotStarted { key, error });
                    continue;
                }
                // A cancel that raced the slot wins: nothing starts after it.
                let Some(slot) = slot.filter(|_| !*cancelled.borrow()) else {
                    let mut rest: Vec<ChildKey> = pending.map(|s| s.key).collect();
                    if let Some(receive) = more.as_mut() {
                        // What the parent sends after this fails to send: it
                        // counts those as not started itself.
                        receive.close();
                        while let Ok(start) = receive.try_recv() {
                            rest.push(start.key);
                        }
                    }
                    for key in std::iter::once(key).chain(rest) {
                        let error = "cancelled before it started".to_owned();
                        let _ = me.cast(AgentMsg::ChildNotStarted { key, error });
                    }
                    return;
                };
                let child_ws = plan.template.workspace_for(workspace.as_ref(), &ids.run_id);
                let machine = match checkpoint {
                    Some(checkpoint) => StepMachine::from_checkpoint(
                        &checkpoint,
                        plan.template.clone(),
                        plan.toolbox_for(&parent, toolbox),
                        hooks.tree_id().clone(),
                    ),
                    None => {
                        let start = plan.start_from(&parent, ids, toolbox);
                        StepMachine::new(
                            start.state,
                            plan.template.clone(),
                            start.toolbox,
                            start.inherited,
                            hooks.tree_id().clone(),
                        )
                        .with_input(plan.prompt.as_deref(), plan.params.as_deref())
                    }
                };
                let args = AgentArgs {
                    hooks: hooks.clone(),
                    machine: Box::new(machine),
                    reply: Reply::Parent(key),
                    slot,
                    parent_span: parent_span.clone(),
                    workspace: child_ws,
                };
                let msg = match Actor::spawn_linked(None, AgentActor, args, me.get_cell()).await {
                    Ok((actor, _)) => AgentMsg::ChildStarted { key, actor },
                    Err(error) => AgentMsg::ChildNotStarted {
                        key,
                        error: format!("could not start: {error}"),
                    },
                };
                let _ = me.cast(msg);
            }
        });
    }
}

/// The tree as the child table's admission asks it ([`admit::Tree`]):
/// the hooks' toolboxes and limits, a resumed tree's children not counted
/// again, and the limits hit kept for their events.
struct HookTree {
    hooks: Arc<dyn crate::hooks::TreeHooks>,
    depth: usize,
    hit: Vec<crate::limit::LimitHit>,
}

impl HookTree {
    fn new(run: &AgentRun) -> Self {
        HookTree {
            hooks: run.hooks.clone(),
            depth: run.machine.state().depth(),
            hit: Vec::new(),
        }
    }
}

impl admit::Tree for HookTree {
    fn toolbox(
        &mut self,
        template: &crate::template::AgentTemplate,
    ) -> Result<Arc<Toolbox>, crate::toolbox::ToolboxError> {
        self.hooks.toolbox(template)
    }

    fn count(&mut self, id: &RunId, index: usize) -> Result<(), crate::limit::LimitHit> {
        // A child a resumed tree already ran was admitted then.
        if self.hooks.recovering() && self.hooks.recovered(id).is_some() {
            return Ok(());
        }
        self.hooks
            .admit_child(self.depth, index)
            .inspect_err(|limit| {
                self.hit.push(limit.clone());
            })
    }
}

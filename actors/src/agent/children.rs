//! A parent's bookkeeping of its children: launching them in live slots, taking
//! their results from supervision events, retries, escalation, and handing each
//! call's reports to the step machine in request order.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorId, ActorRef};
use serde_json::json;
use tokio::task::JoinHandle;

use super::{AgentActor, AgentArgs, AgentMsg, AgentRun, CancelReason, Reply, RunResult};
use crate::checkpoint::{Checkpoint, Recovered};
use crate::event::EventKind;
use crate::history::History;
use crate::hooks::SlotPriority;
use crate::output::output_value;
use crate::spawn::{ChildPlan, ChildReport, ParentInfo, report_value};
use crate::state::{AgentState, AgentStatus};
use crate::step::{Action, StepMachine};
use crate::template::FailurePolicy;
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

/// Identifies one attempt of one child of one spawn call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChildKey {
    pub step: u32,
    pub call: usize,
    pub child: usize,
    pub attempt: u32,
}

struct Slot {
    plan: Option<ChildPlan>,
    /// The run id of the attempt under way.
    current_run_id: String,
    toolbox: Option<Arc<Toolbox>>,
    agent_type: String,
    agent_id: String,
    ordinal: u32,
    attempt: u32,
    run_ids: Vec<String>,
    credits: f64,
    last_failure: Option<ChildReport>,
    report: Option<ChildReport>,
}

struct SpawnCall {
    inline: bool,
    slots: Vec<Slot>,
    delivered: bool,
    /// What the children take from this parent, as of the spawn.
    parent: Arc<ParentInfo>,
}

#[derive(Default)]
pub(super) struct Children {
    calls: BTreeMap<(u32, usize), SpawnCall>,
    live: HashMap<ActorId, (ChildKey, ActorRef<AgentMsg>)>,
    starting: usize,
    retrying: HashMap<ChildKey, JoinHandle<()>>,
    lost: HashMap<ActorId, String>,
    ended: HashSet<ActorId>,
    /// Run ids of children cancelled before they started: the launch task
    /// skips them (also while it waits for their slot: `skip_changed`).
    skip: Arc<std::sync::Mutex<HashSet<String>>>,
    skip_changed: Arc<tokio::sync::Notify>,
}

impl Children {
    pub(super) fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Children that have not reported yet (starting, running or waiting to retry).
    pub(super) fn outstanding(&self) -> usize {
        self.starting + self.live.len() + self.retrying.len()
    }

    /// Removes a child that terminated; remembers it if it had not been seen start.
    pub(super) fn forget(&mut self, id: ActorId) {
        if self.live.remove(&id).is_none() {
            self.ended.insert(id);
        }
    }

    pub(super) fn cancel_all(&mut self, reason: CancelReason) {
        for (_, actor) in self.live.values() {
            let _ = actor.cast(AgentMsg::Cancel(reason.clone()));
        }
        for (key, task) in self.retrying.drain() {
            task.abort();
            if let Some(slot) = slot_mut(&mut self.calls, key) {
                slot.report = slot.last_failure.take();
            }
        }
    }

    /// Call index, credits and run ids of the calls never handed to the machine.
    pub(super) fn undelivered(&mut self) -> Vec<(usize, f64, Vec<String>)> {
        self.calls
            .iter()
            .filter(|(_, c)| !c.delivered)
            .flat_map(|((_, index), c)| {
                c.slots
                    .iter()
                    .map(|s| (*index, s.credits, s.run_ids.clone()))
            })
            .collect()
    }
}

fn slot_mut(calls: &mut BTreeMap<(u32, usize), SpawnCall>, key: ChildKey) -> Option<&mut Slot> {
    calls
        .get_mut(&(key.step, key.call))?
        .slots
        .get_mut(key.child)
}

impl AgentRun {
    pub(super) fn spawn_agents(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        step: u32,
        index: usize,
        children: Vec<Result<ChildPlan, (String, String)>>,
    ) -> Vec<Action> {
        let slots = children
            .into_iter()
            .enumerate()
            .map(|(i, child)| self.admit(child, i))
            .collect();
        self.open_call(myself, step, index, false, slots)
    }

    pub(super) fn spawn_inline(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        step: u32,
        index: usize,
        child: ChildPlan,
    ) -> Vec<Action> {
        let slot = self.admit(Ok(child), 0);
        self.open_call(myself, step, index, true, vec![slot])
    }

    /// Checks a child against the tree's limits and gives it its agent id. Its
    /// state is built only when it gets a live slot.
    fn admit(&mut self, child: Result<ChildPlan, (String, String)>, index: usize) -> Slot {
        let mut slot = Slot {
            plan: None,
            current_run_id: String::new(),
            toolbox: None,
            agent_type: String::new(),
            agent_id: String::new(),
            ordinal: 0,
            attempt: 0,
            run_ids: Vec::new(),
            credits: 0.0,
            last_failure: None,
            report: None,
        };
        let plan = match child {
            Ok(plan) => plan,
            Err((agent_type, error)) => {
                slot.report = Some(ChildReport::refused(&agent_type, &error));
                slot.agent_type = agent_type;
                return slot;
            }
        };
        slot.agent_type = plan.agent_type.clone();
        let depth = self.machine.state().depth();
        // A child a resumed tree already ran was admitted then; it is not counted twice.
        let next = self.machine.children_spawned() + 1;
        let ids = self.hooks.child_ids(self.machine.state(), next, 0);
        let known = self.hooks.recovered(&ids.run_id).is_some();
        let admitted = if known {
            Ok(())
        } else {
            self.hooks.admit_child(depth, index)
        };
        if let Err(limit) = admitted {
            slot.report = Some(ChildReport::refused(&plan.agent_type, &limit.to_string()));
            self.emit(EventKind::LimitHit { limit });
            return slot;
        }
        let toolbox = match self.hooks.toolbox(&plan.template) {
            Ok(toolbox) => toolbox,
            Err(error) => {
                slot.report = Some(ChildReport::refused(&plan.agent_type, &error));
                return slot;
            }
        };
        slot.ordinal = self.machine.next_child_ordinal();
        slot.agent_id = ids.agent_id;
        slot.toolbox = Some(toolbox);
        slot.plan = Some(plan);
        slot
    }

    fn open_call(
        &mut self,
        myself: &ActorRef<AgentMsg>,
        step: u32,
        index: usize,
        inline: bool,
        slots: Vec<Slot>,
    ) -> Vec<Action> {
        let to_launch: Vec<ChildKey> = (0..slots.len())
            .filter(|i| slots[*i].plan.is_some() && slots[*i].report.is_none())
            .map(|child| ChildKey {
                step,
                call: index,
                child,
                attempt: 0,
            })
            .collect();
        let parent = Arc::new(ParentInfo::of(self.machine.state(), self.machine.toolbox()));
        self.children.calls.insert(
            (step, index),
            SpawnCall {
                inline,
                slots,
                delivered: false,
                parent,
            },
        );
        if to_launch.is_empty() {
            return self.deliver_if_complete(step, index);
        }
        // While the step's tools still run the agent keeps its slot; the last
        // one to report gives it back if children are still out.
        if self.tools_running == 0 {
            self.suspend();
        }
        self.launch(myself, to_launch);
        Vec::new()
    }

    /// Starts children (attempts) of one spawn call: one task waits for a live
    /// slot for each in turn, builds its state, and spawns it linked to this actor.
    fn launch(&mut self, myself: &ActorRef<AgentMsg>, keys: Vec<ChildKey>) {
        let mut pending = Vec::with_capacity(keys.len());
        let mut parent_info = None;
        for key in keys {
            let ids = {
                let Some(slot) = slot_mut(&mut self.children.calls, key) else {
                    continue;
                };
                self.hooks
                    .child_ids(self.machine.state(), slot.ordinal, key.attempt)
            };
            let Some(call) = self.children.calls.get_mut(&(key.step, key.call)) else {
                continue;
            };
            parent_info.get_or_insert_with(|| call.parent.clone());
            let Some(slot) = call.slots.get_mut(key.child) else {
                continue;
            };
            let (Some(plan), Some(toolbox)) = (slot.plan.clone(), slot.toolbox.clone()) else {
                continue;
            };
            slot.attempt = key.attempt;
            // Recorded in `run_ids` once it has run (a run that never started has
            // no state to retrieve, so it is not a child run).
            slot.current_run_id = ids.run_id.clone();
            self.hooks.emit(
                &self.run_id,
                EventKind::ChildSpawned {
                    child_run_id: ids.run_id.clone(),
                    agent_type: plan.agent_type.clone(),
                    attempt: key.attempt,
                },
            );
            pending.push((key, plan, toolbox, ids));
        }
        let Some(parent) = parent_info else {
            return;
        };
        self.children.starting += pending.len();
        let skip = self.children.skip.clone();
        let skip_changed = self.children.skip_changed.clone();
        let hooks = self.hooks.clone();
        let depth = parent.lineage.len();
        let mut cancelled = self.cancel_tx.subscribe();
        let me = myself.clone();
        tokio::spawn(async move {
            let mut pending = pending.into_iter();
            while let Some((key, plan, toolbox, ids)) = pending.next() {
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
                    skip.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .contains(&ids.run_id)
                };
                // Cancelled by its run id before it started: it never will.
                let skip_wait = async {
                    loop {
                        let changed = skip_changed.notified();
                        tokio::pin!(changed);
                        changed.as_mut().enable();
                        if skipped() {
                            return;
                        }
                        changed.await;
                    }
                };
                let acquire = hooks.acquire_slot(SlotPriority {
                    depth,
                    resume: false,
                });
                let slot = tokio::select! {
                    biased;
                    _ = cancelled.wait_for(|c| *c) => None,
                    () = skip_wait => {
                        let error = "cancelled before it started".to_owned();
                        let _ = me.cast(AgentMsg::ChildNotStarted { key, error });
                        continue;
                    }
                    slot = acquire => Some(slot),
                };
                if skipped() {
                    let error = "cancelled before it started".to_owned();
                    let _ = me.cast(AgentMsg::ChildNotStarted { key, error });
                    continue;
                }
                // A cancel that raced the slot wins: nothing starts after it.
                let Some(slot) = slot.filter(|_| !*cancelled.borrow()) else {
                    for key in std::iter::once(key).chain(pending.map(|p| p.0)) {
                        let error = "cancelled before it started".to_owned();
                        let _ = me.cast(AgentMsg::ChildNotStarted { key, error });
                    }
                    return;
                };
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
                        .with_input(plan.prompt, plan.params)
                    }
                };
                let args = AgentArgs {
                    hooks: hooks.clone(),
                    machine: Box::new(machine),
                    reply: Reply::Parent(key),
                    slot,
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

    pub(super) fn child_started(
        &mut self,
        key: ChildKey,
        actor: ActorRef<AgentMsg>,
    ) -> Vec<Action> {
        self.children.starting = self.children.starting.saturating_sub(1);
        let id = actor.get_id();
        if self.children.ended.remove(&id) {
            return Vec::new();
        }
        if let Some(error) = self.children.lost.remove(&id) {
            return self.child_result(key, Err(error), true);
        }
        if self.machine.state().status.is_final() {
            let reason = self
                .children_reason
                .clone()
                .unwrap_or(CancelReason::ParentEnded);
            let _ = actor.cast(AgentMsg::Cancel(reason));
        }
        self.children.live.insert(id, (key, actor));
        Vec::new()
    }

    /// A child ended with a result, or could not start.
    pub(super) fn child_ended(
        &mut self,
        _myself: &ActorRef<AgentMsg>,
        key: ChildKey,
        outcome: Result<RunResult, String>,
    ) -> Vec<Action> {
        if outcome.is_err() && !self.children.live.values().any(|(k, _)| *k == key) {
            // ChildNotStarted: it was still counted as starting.
            self.children.starting = self.children.starting.saturating_sub(1);
        }
        // An error here is ChildNotStarted; results come from children that ran.
        let started = outcome.is_ok();
        self.child_result(key, outcome, started)
    }

    /// Cancels the child whose attempt under way is `run_id`: one that runs
    /// directly; one still waiting for its live slot ends `cancelled` now,
    /// without starting (its launch task skips it).
    pub(super) fn cancel_waiting_child(&mut self, run_id: &str) -> Vec<Action> {
        let found = self.children.calls.iter().find_map(|(&(step, call), c)| {
            c.slots.iter().enumerate().find_map(|(child, s)| {
                (s.current_run_id == run_id && s.report.is_none()).then_some(ChildKey {
                    step,
                    call,
                    child,
                    attempt: s.attempt,
                })
            })
        });
        let Some(key) = found else {
            return Vec::new();
        };
        if let Some((_, actor)) = self.children.live.values().find(|(k, _)| *k == key) {
            let _ = actor.cast(AgentMsg::Cancel(CancelReason::Requested));
            return Vec::new();
        }
        self.children
            .skip
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(run_id.to_owned());
        self.children.skip_changed.notify_waiters();
        let Some(slot) = slot_mut(&mut self.children.calls, key) else {
            return Vec::new();
        };
        let Some(plan) = slot.plan.take() else {
            return Vec::new();
        };
        slot.toolbox = None;
        slot.report = Some(ChildReport {
            agent_type: plan.agent_type.clone(),
            agent_name: plan.template.display_name.clone(),
            agent_id: slot.agent_id.clone(),
            run_ids: slot.run_ids.clone(),
            status: AgentStatus::Cancelled,
            value: json!({ "errorMessage": "Agent was cancelled" }),
            credits: slot.credits,
            history: None,
        });
        self.hooks.emit(
            &self.run_id,
            EventKind::ChildFinished {
                child_run_id: run_id.to_owned(),
                status: AgentStatus::Cancelled,
            },
        );
        self.deliver_if_complete(key.step, key.call)
    }

    /// A child of a resumed tree had finished before: its stored result is merged.
    pub(super) fn child_recovered(&mut self, key: ChildKey, result: RunResult) -> Vec<Action> {
        self.children.starting = self.children.starting.saturating_sub(1);
        self.child_result(key, Ok(result), true)
    }

    /// A child actor died without handing over a result (panic or kill).
    pub(super) fn child_lost(
        &mut self,
        _myself: &ActorRef<AgentMsg>,
        id: ActorId,
        error: String,
    ) -> Vec<Action> {
        match self.children.live.remove(&id) {
            Some((key, _)) => self.child_result(key, Err(error), true),
            None => {
                self.children.lost.insert(id, error);
                Vec::new()
            }
        }
    }

    fn child_result(
        &mut self,
        key: ChildKey,
        outcome: Result<RunResult, String>,
        started: bool,
    ) -> Vec<Action> {
        let parent_final = self.machine.state().status.is_final();
        let Some(slot) = slot_mut(&mut self.children.calls, key) else {
            return Vec::new();
        };
        if slot.attempt != key.attempt || slot.report.is_some() {
            return Vec::new();
        }
        let run_id = slot.current_run_id.clone();
        if started && !slot.run_ids.contains(&run_id) {
            slot.run_ids.push(run_id.clone());
        }
        let inline = slot.plan.as_ref().is_some_and(|p| p.inline);
        let (status, value, credits, history) = match outcome {
            Ok(result) => (
                result.state.status,
                report_value(&result.state, result.value),
                result.state.credits_used,
                // Only an inline merge needs the child's history; a spawn_agents
                // parent would otherwise keep every finished child's history alive.
                inline.then(|| result.state.message_history.clone()),
            ),
            Err(error) => (
                AgentStatus::Failed,
                json!({ "errorMessage": error }),
                0.0,
                None,
            ),
        };
        slot.credits += credits;
        let Some(plan) = slot.plan.as_ref() else {
            return Vec::new();
        };
        let template = plan.template.clone();
        let report = ChildReport {
            agent_type: plan.agent_type.clone(),
            agent_name: template.display_name.clone(),
            agent_id: slot.agent_id.clone(),
            run_ids: slot.run_ids.clone(),
            status,
            value,
            credits: slot.credits,
            history,
        };
        let error = report.error_message().unwrap_or_default().to_owned();
        self.hooks.emit(
            &self.run_id,
            EventKind::ChildFinished {
                child_run_id: run_id.clone(),
                status,
            },
        );
        if parent_final || status != AgentStatus::Failed {
            slot.report = Some(report);
            slot.plan = None;
            slot.toolbox = None;
            return self.deliver_if_complete(key.step, key.call);
        }
        match template.failure {
            FailurePolicy::Retry { max, backoff } if key.attempt < max => {
                slot.last_failure = Some(report);
                let delay = backoff.saturating_mul(1 << key.attempt.min(16));
                self.retry_later(key, delay, run_id, error);
                Vec::new()
            }
            FailurePolicy::Escalate => {
                let agent_type = report.agent_type.clone();
                slot.report = Some(report);
                self.machine
                    .fail(format!("child {agent_type} ({run_id}) failed: {error}"))
            }
            FailurePolicy::Report | FailurePolicy::Retry { .. } => {
                slot.report = Some(report);
                slot.plan = None;
                slot.toolbox = None;
                self.deliver_if_complete(key.step, key.call)
            }
        }
    }

    fn retry_later(
        &mut self,
        key: ChildKey,
        delay: Duration,
        failed_run_id: String,
        error: String,
    ) {
        let next = ChildKey {
            attempt: key.attempt + 1,
            ..key
        };
        self.emit(EventKind::ChildRetrying {
            failed_run_id,
            attempt: next.attempt,
            delay_ms: delay.as_millis() as u64,
            error,
        });
        let me = self.myself.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = me.cast(AgentMsg::RetryDue { key: next });
        });
        self.children.retrying.insert(next, task);
    }

    pub(super) fn retry_due(&mut self, myself: &ActorRef<AgentMsg>, key: ChildKey) -> Vec<Action> {
        if self.children.retrying.remove(&key).is_none() || self.machine.state().status.is_final() {
            return Vec::new();
        }
        self.launch(myself, vec![key]);
        Vec::new()
    }

    fn deliver_if_complete(&mut self, step: u32, index: usize) -> Vec<Action> {
        let Some(call) = self.children.calls.get_mut(&(step, index)) else {
            return Vec::new();
        };
        if call.delivered || call.slots.iter().any(|s| s.report.is_none()) {
            return Vec::new();
        }
        if self.machine.state().status.is_final() {
            return Vec::new();
        }
        call.delivered = true;
        let inline = call.inline;
        let reports: Vec<ChildReport> = call
            .slots
            .iter_mut()
            .filter_map(|s| s.report.take())
            .collect();
        self.children.calls.remove(&(step, index));
        let hooks = self.hooks.clone();
        let catalog = super::HookCatalog(hooks.as_ref());
        if inline {
            let Some(report) = reports.into_iter().next() else {
                return Vec::new();
            };
            self.guarded(|m| m.inline_done(step, index, report, &catalog))
        } else {
            self.guarded(|m| m.spawn_done(step, index, reports, &catalog))
        }
    }
}

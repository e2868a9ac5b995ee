//! Supervision as data (semantics §8): a parent's table of its children and
//! every decision about them, with no I/O, no runtime and no clock.
//!
//! The agent actor feeds the table what happened ([`Input`]: a spawn call
//! opened, a child started, ended, was lost, a retry timer fired, a cancel
//! asked for, the parent ended) and carries out what it answers ([`Output`]:
//! start children, schedule a retry, cancel a child, emit an event, hand a
//! call's reports to the step machine in request order, fail the parent).
//! Children are named by `A`, the driver's handle of a child actor (its actor
//! id); the table never touches one.

use std::collections::BTreeMap;
use std::hash::Hash;
use std::sync::Arc;

use serde_json::json;

use crate::event::EventKind;
use crate::failure::{Failure, FailureKind};
use crate::hooks::SlotPriority;
use crate::id::RunId;
use crate::idmap::{IdMap, IdSet};
use crate::spawn::{ChildReport, ParentInfo, report_value};
use crate::state::AgentStatus;
use crate::template::FailurePolicy;

pub mod admit;
mod io;
mod slot;

pub use io::{
    Admission, CancelReason, ChildKey, Delivery, Input, Launch, Output, Planner, RunResult, Start,
    Stream,
};

use slot::{Call, Entry, Slot, entry_of};

/// How many first attempts of a waited-for call's children are launched
/// and not yet started at once: the rest wait in the call as numbers
/// ([`Admission::Waiting`]) and come up as those start. Enough that the
/// launch never waits for the parent between two slots.
pub const LAUNCH_WINDOW: usize = 64;

/// A parent's children: every spawn call not yet delivered, the children that
/// run, start or wait to retry, and the races between their messages.
#[derive(Debug)]
pub struct Children<A> {
    calls: BTreeMap<(u32, usize), Call>,
    live: IdMap<A, ChildKey>,
    starting: usize,
    retrying: IdSet<ChildKey>,
    /// Children lost before their start was seen.
    lost: IdMap<A, String>,
    /// Children that ended before their start was seen.
    ended: IdSet<A>,
    /// Set once the parent's run is over.
    parent_ended: Option<CancelReason>,
}

impl<A> Default for Children<A> {
    fn default() -> Self {
        Children {
            calls: BTreeMap::new(),
            live: IdMap::default(),
            starting: 0,
            retrying: IdSet::default(),
            lost: IdMap::default(),
            ended: IdSet::default(),
            parent_ended: None,
        }
    }
}

impl<A: Clone + Eq + Hash> Children<A> {
    /// Children whose actor runs.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Whether this actor is a running child.
    pub fn is_live(&self, actor: &A) -> bool {
        self.live.contains_key(actor)
    }

    /// Children that have not reported yet (starting, running or waiting to retry).
    pub fn outstanding(&self) -> usize {
        self.starting + self.live.len() + self.retrying.len()
    }

    /// Children of calls the parent waits for (not in the background) that
    /// have not reported yet.
    pub fn awaited(&self) -> usize {
        self.calls
            .values()
            .filter(|c| !c.background)
            .map(Call::pending)
            .sum()
    }

    /// Call index, credits and run ids of the calls never handed to the
    /// machine, in call order (for `StepMachine::close_children`).
    pub fn undelivered(&self) -> Vec<(usize, f64, Vec<RunId>)> {
        self.calls
            .iter()
            .flat_map(|((_, index), c)| {
                c.slots
                    .iter()
                    .filter_map(Entry::slot)
                    .filter(|s| !s.delivered)
                    .map(|s| (*index, s.credits, s.run_ids(&c.parent.run_id)))
            })
            .collect()
    }

    /// Takes one input.
    pub fn handle(&mut self, input: Input<A>) -> Vec<Output<A>> {
        let mut out = Vec::new();
        match input {
            Input::Open {
                step,
                call,
                inline,
                background,
                parent,
                children,
                planner,
            } => {
                let how = Opening {
                    inline,
                    background,
                    planner,
                };
                self.open((step, call), how, parent, children, &mut out)
            }
            Input::Started { key, actor } => {
                self.started(key, actor, &mut out);
                self.acked(key, &mut out);
            }
            Input::Ended { key, actor, result } => {
                if self.live.remove(&actor).is_none() {
                    self.ended.insert(actor);
                }
                self.result(key, Ok(result), true, &mut out);
            }
            Input::NotStarted { key, error } => {
                self.starting = self.starting.saturating_sub(1);
                self.result(key, Err(error), false, &mut out);
                // An escalated failure ends the parent: nothing more comes up.
                if !out.iter().any(|o| matches!(o, Output::Fail { .. })) {
                    self.acked(key, &mut out);
                }
            }
            Input::Recovered { key, result } => {
                self.starting = self.starting.saturating_sub(1);
                self.result(key, Ok(result), true, &mut out);
                self.acked(key, &mut out);
            }
            Input::Lost { actor, error } => match self.live.remove(&actor) {
                Some(key) => self.result(key, Err(error), true, &mut out),
                None => {
                    self.lost.insert(actor, error);
                }
            },
            Input::RetryDue { key } => {
                if self.retrying.remove(&key) && self.parent_ended.is_none() {
                    self.launch(vec![key], How::Once, &mut out);
                }
            }
            Input::Cancel { run_id } => self.cancel(run_id, &mut out),
            Input::ParentEnded { cancelled } => {
                // A cancel goes down the tree as it came; a parent that ended
                // by itself ends its children as `ParentEnded`.
                let reason = cancelled.unwrap_or(CancelReason::ParentEnded);
                self.parent_ended(reason, &mut out);
            }
        }
        out
    }

    fn open(
        &mut self,
        (step, call): (u32, usize),
        how: Opening,
        parent: Arc<ParentInfo>,
        children: Vec<Admission>,
        out: &mut Vec<Output<A>>,
    ) {
        let Opening {
            inline,
            background,
            planner,
        } = how;
        let mut slots: Vec<Entry> = children
            .into_iter()
            .map(|c| entry_of(c, &parent.run_id))
            .collect();
        if background {
            // The call's result already told the model of a refused child.
            for slot in slots.iter_mut().filter_map(Entry::slot_mut) {
                if slot.report.is_some() {
                    slot.delivered = true;
                }
            }
        }
        let launchable = slots.iter().filter(|e| e.launchable()).count();
        let pending = slots.iter().filter(|e| e.pending()).count();
        self.calls.insert(
            (step, call),
            Call {
                inline,
                background,
                slots,
                pending,
                parent,
                planner,
                next: 0,
                launching: 0,
                // A background call's children are all announced at once:
                // their ids are in the call's result already.
                window: if background {
                    usize::MAX
                } else {
                    LAUNCH_WINDOW
                },
                streaming: false,
            },
        );
        if launchable == 0 {
            return self.deliver_if_complete(step, call, out);
        }
        if !background {
            out.push(Output::Wait);
        }
        self.fill((step, call), Some(launchable), out);
    }

    /// Launches the call's next children, up to its window of first
    /// attempts not yet started (`line`: the call's first launch, for
    /// that many children in all).
    fn fill(&mut self, (step, call): (u32, usize), line: Option<usize>, out: &mut Vec<Output<A>>) {
        if self.parent_ended.is_some() {
            return;
        }
        let Some(c) = self.calls.get_mut(&(step, call)) else {
            return;
        };
        if line.is_none() && !c.streaming {
            return;
        }
        let mut keys = Vec::new();
        let mut unplanned = Vec::new();
        while c.launching < c.window && c.next < c.slots.len() {
            let child = c.next;
            c.next += 1;
            if !c.slots[child].launchable() {
                continue;
            }
            match c.materialize(child) {
                Some(_) => {
                    c.launching += 1;
                    keys.push(ChildKey {
                        step,
                        call,
                        child,
                        attempt: 0,
                    });
                }
                None => unplanned.push((child, format!("agents[{child}] could not be planned"))),
            }
        }
        let last = c.next >= c.slots.len();
        let how = match line {
            Some(_) if last => How::Once,
            Some(line) => How::First(Stream {
                call: (step, call),
                line,
            }),
            None => How::More {
                call: (step, call),
                last,
            },
        };
        c.streaming = !last;
        for (child, error) in unplanned {
            let report = ChildReport::refused("", &error);
            self.settle(
                ChildKey {
                    step,
                    call,
                    child,
                    attempt: 0,
                },
                report,
            );
        }
        self.launch(keys, how, out);
        self.deliver_if_complete(step, call, out);
    }

    /// A first attempt launched from a call's window started (or did not):
    /// the next child may come up.
    fn acked(&mut self, key: ChildKey, out: &mut Vec<Output<A>>) {
        if key.attempt != 0 {
            return;
        }
        let Some(c) = self.calls.get_mut(&(key.step, key.call)) else {
            return;
        };
        c.launching = c.launching.saturating_sub(1);
        self.fill((key.step, key.call), None, out);
    }

    /// Starts attempts of one spawn call's children, each announced first.
    fn launch(&mut self, keys: Vec<ChildKey>, how: How, out: &mut Vec<Output<A>>) {
        let mut children = Vec::with_capacity(keys.len());
        let mut parent = None;
        for key in keys {
            let Some(call) = self.calls.get_mut(&(key.step, key.call)) else {
                continue;
            };
            let parent = parent.get_or_insert_with(|| call.parent.clone());
            let Some(slot) = call.slots.get_mut(key.child).and_then(Entry::slot_mut) else {
                continue;
            };
            let (Some(plan), Some(toolbox), Some(id)) =
                (slot.plan.clone(), slot.toolbox.clone(), slot.id.clone())
            else {
                continue;
            };
            let child_run_id = id.ids(&parent.run_id, key.attempt).run_id;
            let start = Start {
                key,
                plan,
                toolbox,
                id,
            };
            // Recorded in `ran` once it has run (a run that never started has
            // no state to retrieve, so it is not a child run).
            slot.attempt = key.attempt;
            out.push(Output::Emit(EventKind::ChildSpawned {
                child_run_id,
                agent_type: start.plan.agent_type.to_string(),
                attempt: key.attempt,
            }));
            children.push(start);
        }
        self.starting += children.len();
        if let How::More { call, last } = how {
            // Even empty, the last tells the launch that no more follow.
            if children.is_empty() && !last {
                return;
            }
            out.push(Output::More {
                call,
                children,
                last,
            });
            return;
        }
        let Some(parent) = parent else {
            return;
        };
        if children.is_empty() {
            return;
        }
        let priority = SlotPriority {
            depth: parent.lineage.len(),
            resume: false,
        };
        out.push(Output::Launch(Launch {
            parent,
            priority,
            children,
            stream: match how {
                How::First(stream) => Some(stream),
                How::Once | How::More { .. } => None,
            },
        }));
    }

    fn started(&mut self, key: ChildKey, actor: A, out: &mut Vec<Output<A>>) {
        self.starting = self.starting.saturating_sub(1);
        if self.ended.remove(&actor) {
            return;
        }
        if let Some(error) = self.lost.remove(&actor) {
            return self.result(key, Err(error), true, out);
        }
        if let Some(reason) = &self.parent_ended {
            // Started after its parent ended: it stops at once.
            out.push(Output::Cancel {
                actor: actor.clone(),
                reason: reason.clone(),
            });
        }
        self.live.insert(actor, key);
    }

    /// A child that runs is cancelled directly; one still waiting for its live
    /// slot ends `cancelled` now, without starting.
    fn cancel(&mut self, run: RunId, out: &mut Vec<Output<A>>) {
        let run_parent = run.parent();
        let found = self.calls.iter().find_map(|(&(step, call), c)| {
            let parent = &c.parent.run_id;
            // A child not launched yet was never announced.
            c.slots
                .iter()
                .enumerate()
                .take(c.next)
                .find_map(|(child, e)| {
                    let s = e.slot()?;
                    let live = s.report.is_none() && !s.delivered;
                    (live && s.runs_as(parent, &run, run_parent.as_ref())).then_some(ChildKey {
                        step,
                        call,
                        child,
                        attempt: s.attempt,
                    })
                })
        });
        let Some(key) = found else {
            return;
        };
        if let Some((actor, _)) = self.live.iter().find(|(_, k)| **k == key) {
            out.push(Output::Cancel {
                actor: actor.clone(),
                reason: CancelReason::Requested,
            });
            return;
        }
        out.push(Output::Skip {
            run_id: run.clone(),
        });
        let Some(parent_run) = self.parent_run(key) else {
            return;
        };
        let Some(slot) = self.slot_mut(key) else {
            return;
        };
        let Some(report) = slot.report(
            &parent_run,
            AgentStatus::Cancelled,
            json!({ "errorMessage": "Agent was cancelled" }),
            None,
            Some(FailureKind::Cancelled),
        ) else {
            return;
        };
        self.settle(key, report);
        out.push(Output::Emit(EventKind::ChildFinished {
            child_run_id: run,
            status: AgentStatus::Cancelled,
        }));
        self.deliver_if_complete(key.step, key.call, out);
    }

    fn parent_ended(&mut self, reason: CancelReason, out: &mut Vec<Output<A>>) {
        self.parent_ended = Some(reason.clone());
        let mut live: Vec<(&A, &ChildKey)> = self.live.iter().collect();
        live.sort_by_key(|(_, key)| **key);
        for (actor, _) in live {
            out.push(Output::Cancel {
                actor: actor.clone(),
                reason: reason.clone(),
            });
        }
        let mut retrying: Vec<ChildKey> = self.retrying.drain().collect();
        retrying.sort();
        for key in retrying {
            out.push(Output::StopRetry { key });
            // It stays failed, as its last attempt ended.
            if let Some(slot) = self.slot_mut(key)
                && let Some(report) = slot.last_failure.take()
            {
                self.settle(key, *report);
            }
        }
    }

    /// A child's attempt ended (`started`: it ran, so its run id is on record):
    /// report it, retry it, or escalate, per its template's policy.
    fn result(
        &mut self,
        key: ChildKey,
        outcome: Result<RunResult, String>,
        started: bool,
        out: &mut Vec<Output<A>>,
    ) {
        let parent_ended = self.parent_ended.is_some();
        let Some(parent_run) = self.parent_run(key) else {
            return;
        };
        let Some(slot) = self.slot_mut(key) else {
            return;
        };
        // A stale attempt, or a child that has its report already.
        if slot.attempt != key.attempt || slot.report.is_some() || slot.delivered {
            return;
        }
        let Some(run_id) = slot.agent_id(&parent_run).map(|id| id.retry(key.attempt)) else {
            return;
        };
        if started && !slot.ran.contains(&key.attempt) {
            slot.ran.push(key.attempt);
        }
        let inline = slot.plan.as_ref().is_some_and(|p| p.inline);
        let (status, value, credits, history, error_kind) = match outcome {
            Ok(result) => (
                result.state.status,
                report_value(&result.state, result.value),
                result.state.credits_used,
                // Only an inline merge needs the child's history; a spawn_agents
                // parent would otherwise keep every finished child's history alive.
                inline.then(|| result.state.message_history.clone()),
                match result.state.status {
                    AgentStatus::Completed | AgentStatus::Running => None,
                    AgentStatus::Cancelled => Some(FailureKind::Cancelled),
                    // A failed state stored before kinds were recorded has none.
                    AgentStatus::Failed => {
                        Some(result.state.error_kind.unwrap_or(FailureKind::Internal))
                    }
                },
            ),
            Err(error) => (
                AgentStatus::Failed,
                json!({ "errorMessage": error }),
                0.0,
                None,
                Some(if started {
                    FailureKind::Lost
                } else {
                    FailureKind::NotStarted
                }),
            ),
        };
        slot.credits += credits;
        let Some(plan) = slot.plan.as_ref() else {
            return;
        };
        let failure = plan.template.failure;
        let Some(report) = slot.report(&parent_run, status, value, history, error_kind) else {
            return;
        };
        out.push(Output::Emit(EventKind::ChildFinished {
            child_run_id: run_id.clone(),
            status,
        }));
        if parent_ended || status != AgentStatus::Failed {
            self.settle(key, report);
            return self.deliver_if_complete(key.step, key.call, out);
        }
        let error = report.error_message().unwrap_or_default().to_owned();
        match failure {
            FailurePolicy::Retry { max, backoff } if key.attempt < max => {
                slot.last_failure = Some(Box::new(report));
                let delay = backoff.saturating_mul(1 << key.attempt.min(16));
                let next = ChildKey {
                    attempt: key.attempt + 1,
                    ..key
                };
                out.push(Output::Emit(EventKind::ChildRetrying {
                    failed_run_id: run_id,
                    attempt: next.attempt,
                    delay_ms: delay.as_millis() as u64,
                    error,
                }));
                out.push(Output::Retry { key: next, delay });
                self.retrying.insert(next);
            }
            FailurePolicy::Escalate => {
                let agent_type = report.agent_type.clone();
                self.settle(key, report);
                out.push(Output::Fail {
                    failure: Failure::new(
                        FailureKind::ChildFailed,
                        format!("child {agent_type} ({run_id}) failed: {error}"),
                    ),
                });
            }
            FailurePolicy::Report | FailurePolicy::Retry { .. } => {
                self.settle(key, report);
                self.deliver_if_complete(key.step, key.call, out);
            }
        }
    }

    /// Once every child of the call has its report (and the parent still
    /// runs), the reports go to the machine, in request order.
    fn deliver_if_complete(&mut self, step: u32, call: usize, out: &mut Vec<Output<A>>) {
        if self.parent_ended.is_some() {
            return;
        }
        let Some(c) = self.calls.get_mut(&(step, call)) else {
            return;
        };
        if c.background {
            // Each background child's report goes on its own, once.
            for slot in c.slots.iter_mut().filter_map(Entry::slot_mut) {
                if slot.delivered {
                    continue;
                }
                if let Some(report) = slot.report.take() {
                    slot.delivered = true;
                    out.push(Output::Report(report));
                }
            }
            if c.slots
                .iter()
                .all(|e| e.slot().is_some_and(|s| s.delivered))
            {
                self.calls.remove(&(step, call));
            }
            return;
        }
        if c.pending() > 0 {
            return;
        }
        let Some(mut c) = self.calls.remove(&(step, call)) else {
            return;
        };
        let reports = c
            .slots
            .iter_mut()
            .filter_map(Entry::slot_mut)
            .filter_map(|s| s.report.take().map(|r| *r))
            .collect();
        out.push(Output::Deliver(Delivery {
            step,
            call,
            inline: c.inline,
            reports,
        }));
    }

    /// Gives the child of `key` its final report.
    fn settle(&mut self, key: ChildKey, report: ChildReport) {
        if let Some(call) = self.calls.get_mut(&(key.step, key.call)) {
            call.settle(key.child, report);
        }
    }

    /// The run id of the parent of `key`'s call (its children's ids extend it).
    fn parent_run(&self, key: ChildKey) -> Option<RunId> {
        Some(self.calls.get(&(key.step, key.call))?.parent.run_id.clone())
    }

    /// The slot of `key`.
    fn slot_mut(&mut self, key: ChildKey) -> Option<&mut Slot> {
        let call = self.calls.get_mut(&(key.step, key.call))?;
        call.slots.get_mut(key.child)?.slot_mut()
    }
}

/// How a spawn call is opened.
struct Opening {
    inline: bool,
    background: bool,
    planner: Option<Planner>,
}

/// How a launch's children go out.
enum How {
    /// In one launch (all of them, or a retry).
    Once,
    /// The first of a call's children that more follow.
    First(Stream),
    /// More children for the launch of `call`; `last`: no more follow.
    More { call: (u32, usize), last: bool },
}

#[cfg(test)]
mod tests;

//! A spawn call's children as the table keeps them: a slot per requested
//! child (its plan until it reports, its attempts, its report) and the ids
//! they run under, kept small (a wide call holds a slot per child: issue 34).

use std::sync::Arc;

use serde_json::Value;

use super::io::{Admission, ChildId, Planner};
use crate::failure::FailureKind;
use crate::history::History;
use crate::id::{AgentId, RunId};
use crate::spawn::{ChildPlan, ChildReport, ParentInfo};
use crate::state::AgentStatus;
use crate::toolbox::Toolbox;

/// One requested child: its attempts so far and its report once it has one.
#[derive(Debug)]
pub(super) struct Slot {
    /// What it runs, until it has its report. The plan (shared with the
    /// launch that starts it) and the reports are held by pointer: a call
    /// holds a slot per child until it is delivered (10,000 in a wide call),
    /// and inline they made a slot 1 KB.
    pub(super) plan: Option<Arc<ChildPlan>>,
    pub(super) toolbox: Option<Arc<Toolbox>>,
    /// The agent id of an admitted child (attempt `n` runs as `id.retry(n)`).
    pub(super) id: Option<ChildId>,
    /// The attempt under way (or the last one): its run id is `id.retry(attempt)`.
    pub(super) attempt: u32,
    /// The attempts that ran, in order: the report's `run_ids` are their run
    /// ids. Numbers, not strings: a wide call holds a slot per child.
    pub(super) ran: Vec<u32>,
    pub(super) credits: f64,
    pub(super) last_failure: Option<Box<ChildReport>>,
    pub(super) report: Option<Box<ChildReport>>,
    /// A background child's report was handed over (or it was refused).
    pub(super) delivered: bool,
}

impl Slot {
    /// The report of an admitted child whose attempt ended so: its type, name,
    /// ids and credits so far are the slot's. `None` once it has its report.
    pub(super) fn report(
        &self,
        parent: &RunId,
        status: AgentStatus,
        value: Value,
        history: Option<History>,
        error_kind: Option<FailureKind>,
    ) -> Option<ChildReport> {
        let plan = self.plan.as_ref()?;
        Some(ChildReport {
            agent_type: plan.agent_type.to_string(),
            agent_name: plan.template.display_name.clone(),
            agent_id: self.agent_id(parent).map(AgentId::from_run),
            run_ids: self.run_ids(parent),
            status,
            value,
            credits: self.credits,
            history,
            error_kind,
        })
    }

    /// The agent id of an admitted child.
    pub(super) fn agent_id(&self, parent: &RunId) -> Option<RunId> {
        Some(self.id.as_ref()?.resolve(parent))
    }

    /// The run ids of the attempts that ran, in order.
    pub(super) fn run_ids(&self, parent: &RunId) -> Vec<RunId> {
        let Some(id) = self.agent_id(parent) else {
            return Vec::new();
        };
        self.ran.iter().map(|&attempt| id.retry(attempt)).collect()
    }

    /// Whether the attempt under way (or the last one) is `run`, whose
    /// parent is `run_parent` (`run.parent()`, made once by the caller).
    pub(super) fn runs_as(&self, parent: &RunId, run: &RunId, run_parent: Option<&RunId>) -> bool {
        if self.attempt != run.attempt() {
            return false;
        }
        match &self.id {
            // The common case without making the id: `P.n~a` is `run`.
            Some(ChildId::Of(n)) => {
                run.path().last().is_some_and(|s| s.ordinal == *n) && run_parent == Some(parent)
            }
            Some(ChildId::Given(id)) => id.has_attempt(run),
            None => false,
        }
    }

    /// Gives the child its final report (its plan is no longer needed).
    pub(super) fn settle(&mut self, report: ChildReport) {
        self.report = Some(Box::new(report));
        self.plan = None;
        self.toolbox = None;
    }
}

impl Call {
    /// Slots without their report yet (a call is delivered when none is
    /// left): kept as a count, so a child's report costs O(1), not a walk over
    /// the call's slots (a call of 10,000 children walked 10,000 slots per report).
    pub(super) fn pending(&self) -> usize {
        debug_assert_eq!(
            self.pending,
            self.slots.iter().filter(|e| e.pending()).count(),
            "the pending count follows the slots"
        );
        self.pending
    }

    /// Gives slot `child` its final report, counting it off the pending ones.
    pub(super) fn settle(&mut self, child: usize, report: ChildReport) {
        let Some(entry) = self.slots.get_mut(child) else {
            return;
        };
        if entry.pending() {
            self.pending = self.pending.saturating_sub(1);
        }
        match entry {
            Entry::Slot(slot) => slot.settle(report),
            Entry::Waiting { .. } => {
                let mut slot = empty_slot();
                slot.settle(report);
                *entry = Entry::Slot(Box::new(slot));
            }
        }
    }
}

#[derive(Debug)]
pub(super) struct Call {
    pub(super) inline: bool,
    pub(super) background: bool,
    pub(super) slots: Vec<Entry>,
    /// How many of `slots` have no report yet and were not handed over.
    pub(super) pending: usize,
    pub(super) parent: Arc<ParentInfo>,
    /// What the waiting children's plans are made from.
    pub(super) planner: Option<Planner>,
    /// The next child to launch: the ones before it were launched (or never
    /// needed to be).
    pub(super) next: usize,
    /// First attempts launched whose start (or failure to start) is not
    /// known yet.
    pub(super) launching: usize,
    /// How many first attempts may be launched and not started at once.
    pub(super) window: usize,
    /// Whether the call's launch waits for more children (its first
    /// `Launch` had a `stream`, and the last `More` was not sent yet).
    pub(super) streaming: bool,
}

/// A requested child as its call keeps it: a number until it comes up
/// (issue 34: a call of 9,999 children holds each in 8 bytes while it
/// waits), then a slot.
#[derive(Debug)]
pub(super) enum Entry {
    /// Admitted, not launched yet: its kind in the call's plan and the
    /// ordinal its agent id extends its parent's run id with.
    Waiting { kind: u16, ordinal: u32 },
    /// Launched, refused, or started again under a stored id.
    Slot(Box<Slot>),
}

impl Entry {
    pub(super) fn slot(&self) -> Option<&Slot> {
        match self {
            Entry::Slot(slot) => Some(slot),
            Entry::Waiting { .. } => None,
        }
    }

    pub(super) fn slot_mut(&mut self) -> Option<&mut Slot> {
        match self {
            Entry::Slot(slot) => Some(slot),
            Entry::Waiting { .. } => None,
        }
    }

    /// Without its report, and not handed over: the call waits for it.
    pub(super) fn pending(&self) -> bool {
        self.slot()
            .is_none_or(|s| s.report.is_none() && !s.delivered)
    }

    /// Admitted and not yet launched (at its open, every admitted child).
    pub(super) fn launchable(&self) -> bool {
        match self {
            Entry::Waiting { .. } => true,
            Entry::Slot(s) => s.plan.is_some() && s.report.is_none() && !s.delivered,
        }
    }
}

impl Call {
    /// The slot of child `child`, made now from the call's plan if it was
    /// waiting; `None` if it cannot be planned (there is no such child, or
    /// its entry is gone: the plan checked it when the call was classified).
    pub(super) fn materialize(&mut self, child: usize) -> Option<&mut Slot> {
        let entry = self.slots.get_mut(child)?;
        if let Entry::Waiting { kind, ordinal } = *entry {
            let planned = self.planner.as_ref().and_then(|p| {
                let plan = p.plan.child(child, kind)?;
                let toolbox = p.toolboxes.get(usize::from(kind))?.clone()?;
                Some((plan, toolbox))
            });
            let (plan, toolbox) = planned?;
            let mut slot = empty_slot();
            slot.plan = Some(Arc::new(plan));
            slot.toolbox = Some(toolbox);
            slot.id = Some(ChildId::Of(ordinal));
            *entry = Entry::Slot(Box::new(slot));
        }
        entry.slot_mut()
    }
}

fn empty_slot() -> Slot {
    Slot {
        plan: None,
        toolbox: None,
        id: None,
        attempt: 0,
        ran: Vec::new(),
        credits: 0.0,
        last_failure: None,
        report: None,
        delivered: false,
    }
}

pub(super) fn entry_of(admission: Admission, parent: &RunId) -> Entry {
    let mut slot = empty_slot();
    match admission {
        Admission::Refused { agent_type, error } => {
            slot.report = Some(Box::new(ChildReport::refused(&agent_type, &error)));
        }
        Admission::Admitted { plan, toolbox, id } => {
            slot.plan = Some(Arc::new(plan));
            slot.toolbox = Some(toolbox);
            slot.id = Some(ChildId::new(id, parent));
        }
        Admission::Waiting { kind, ordinal } => return Entry::Waiting { kind, ordinal },
    }
    Entry::Slot(Box::new(slot))
}

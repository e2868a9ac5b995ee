//! Background children (semantics §15): `spawn_agents_async` starts children
//! and its result comes back at once with their run ids; each child's report
//! joins the history as a user message tagged [`BACKGROUND_REPORT`] at the
//! next step boundary; a turn that would end while some still run waits for
//! them (or cancels them: the template's `on_turn_end`).
//!
//! Which children a run still waits for is read off its history: started by
//! a `spawn_agents_async` result, not yet reported by a report message. A run
//! that goes on from a checkpoint therefore knows exactly which reports it
//! has had (they are in the checkpoint's history) and which it still needs,
//! so every started child is delivered once, across any crash and resume.

use serde_json::{Value, json};

use super::{Action, Catalog, StepMachine};
use crate::event::EventKind;
use crate::history::History;
use crate::id::{AgentId, RunId};
use crate::message::{Message, ToolResultPart};
use crate::spawn::{ChildPlan, ChildReport, SpawnRequest, plan_child};
use crate::state::AgentStatus;
use crate::template::OnTurnEnd;
use crate::toolbox::SPAWN_AGENTS_ASYNC;

/// Tag of the user message that brings a background child's report.
pub const BACKGROUND_REPORT: &str = "BACKGROUND_REPORT";

/// One child of a `spawn_agents_async` call as it was started (or refused).
#[derive(Clone, Debug)]
pub enum Started {
    /// Admitted: it runs in the background under these ids.
    Running {
        /// The child's agent id (every attempt's run id derives from it).
        agent_id: AgentId,
        /// Its first attempt's run id.
        run_id: RunId,
        /// Its `agentType` (the matched `spawnableAgents` entry).
        agent_type: String,
        /// Its template's display name.
        agent_name: String,
    },
    /// Not started: the requested type and why (the model reads it).
    Refused {
        /// The agent type as requested.
        agent_type: String,
        /// Why.
        error: String,
    },
}

impl Started {
    fn entry(&self) -> Value {
        match self {
            Started::Running {
                agent_id,
                run_id,
                agent_type,
                agent_name,
            } => json!({
                "agentName": agent_name,
                "agentType": agent_type,
                "agentId": agent_id,
                "runId": run_id,
                "status": "running",
            }),
            Started::Refused { agent_type, error } => json!({
                "agentType": agent_type,
                "errorMessage": error,
            }),
        }
    }
}

/// How a run waits at the end of its turn for background reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Waiting {
    /// Each report starts a step (the model answers it).
    Step,
    /// The reports go into the history as they come, with no step (a
    /// program that is done, or a run with no steps left); the run
    /// completes with the last.
    All,
    /// A resumed or replayed run waits at a step boundary for the reports
    /// its journal delivered there.
    Schedule,
}

pub use crate::checkpoint::Scheduled;

/// A background child a run still waits for, as its history tells.
#[derive(Clone, Debug, PartialEq)]
pub struct Outstanding {
    /// The child's agent id.
    pub agent_id: AgentId,
    /// The call that started it.
    pub call_id: String,
    /// Its entry of that call's `agents`, as the model asked for it.
    pub request: Value,
    /// Messages of the history up to and including the call's assistant
    /// message (the spawn's snapshot is taken from them).
    pub upto: usize,
}

/// The background children `history` started and has no report of, in the
/// order they were started. An entry whose `agentId` is no agent id (Arbor
/// never writes one) names no child.
pub fn outstanding(history: &History) -> Vec<Outstanding> {
    let mut calls: Vec<(String, Value, usize)> = Vec::new();
    let mut started: Vec<Outstanding> = Vec::new();
    let mut reported: Vec<AgentId> = Vec::new();
    for (at, message) in history.iter().enumerate() {
        match &**message {
            Message::Assistant { .. } => {
                for call in message.tool_calls() {
                    if call.tool_name == SPAWN_AGENTS_ASYNC {
                        calls.push((call.tool_call_id.clone(), call.input.value(), at + 1));
                    }
                }
            }
            Message::Tool {
                tool_call_id,
                content,
                ..
            } => {
                let Some((call_id, input, upto)) =
                    calls.iter().find(|(id, _, _)| id == tool_call_id)
                else {
                    continue;
                };
                let input = match input {
                    Value::String(text) => serde_json::from_str(text).unwrap_or(Value::Null),
                    other => other.clone(),
                };
                let Some(ToolResultPart::Json {
                    value: Value::Array(entries),
                }) = content.first()
                else {
                    continue;
                };
                for (i, entry) in entries.iter().enumerate() {
                    if entry.get("errorMessage").is_some() {
                        continue;
                    }
                    let Some(Ok(agent_id)) = entry
                        .get("agentId")
                        .and_then(Value::as_str)
                        .map(str::parse::<AgentId>)
                    else {
                        continue;
                    };
                    started.push(Outstanding {
                        agent_id,
                        call_id: call_id.clone(),
                        request: input["agents"][i].clone(),
                        upto: *upto,
                    });
                }
            }
            Message::User { .. } if message.has_tag(BACKGROUND_REPORT) => {
                if let Some(id) = reported_agent(message) {
                    reported.push(id);
                }
            }
            _ => {}
        }
    }
    started.retain(|s| !reported.contains(&s.agent_id));
    started
}

/// The first message a compaction's summary must keep: the call of the
/// earliest `spawn_agents_async` whose children have not all reported;
/// `None` when none waits.
pub fn pinned(history: &History) -> Option<usize> {
    outstanding(history)
        .iter()
        .map(|o| o.upto.saturating_sub(1))
        .min()
}

/// The agent id a report message is about.
pub fn reported_agent(message: &Message) -> Option<AgentId> {
    let text = message.text();
    let (_, body) = text.split_once('\n')?;
    let value: Value = serde_json::from_str(body).ok()?;
    value.get("agentId")?.as_str()?.parse().ok()
}

/// A run id in words: itself, or nothing when there is none.
struct OrEmpty<'a>(Option<&'a RunId>);

impl std::fmt::Display for OrEmpty<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(id) => id.fmt(f),
            None => Ok(()),
        }
    }
}

/// The message that brings `report` (cut to `budget` estimated tokens, as a
/// spawn result's entry is): a sentence for the model, then the entry as JSON.
pub(crate) fn report_message(report: &ChildReport, budget: Option<u64>) -> Message {
    let run_id = OrEmpty(report.run_ids.last());
    let how = match report.status {
        AgentStatus::Completed => "finished",
        AgentStatus::Failed => "failed",
        AgentStatus::Cancelled => "was cancelled",
        AgentStatus::Running => "stopped",
    };
    let mut entry = report.entry(budget);
    entry["status"] = json!(report.status);
    Message::user(format!(
        "Background agent {} ({run_id}) {how}. Its report:\n{entry}",
        report.agent_type
    ))
    .with_tag(BACKGROUND_REPORT)
}

impl StepMachine {
    /// The children of a `spawn_agents_async` call were started (or
    /// refused): its result lists them at once, and the run goes on.
    pub fn background_started(
        &mut self,
        step: u32,
        index: usize,
        started: Vec<Started>,
        catalog: &dyn Catalog,
    ) -> Vec<Action> {
        let Some(pending) = self.pending_for(step, index) else {
            return Vec::new();
        };
        let entries: Vec<Value> = started.iter().map(Started::entry).collect();
        pending.results[index] = Some(Message::tool_result(&pending.calls[index], json!(entries)));
        for child in started {
            if let Started::Running { agent_id, .. } = child {
                self.side().background.push(agent_id);
            }
        }
        self.resolved(catalog)
    }

    /// A background child has its final report: it joins the history at the
    /// next step boundary. A run that waits at the end of its turn takes it
    /// now (a step, or straight into the history, by how it waits).
    pub fn background_reported(&mut self, report: ChildReport) -> Vec<Action> {
        let ended = self.state.status.is_final();
        // No sideband: no background child was started, none is out.
        let Some(side) = self.side.as_deref_mut() else {
            return Vec::new();
        };
        let Some(agent_id) = &report.agent_id else {
            return Vec::new();
        };
        if ended || !side.background.contains(agent_id) {
            return Vec::new();
        }
        if side.arrived.iter().any(|r| r.agent_id == report.agent_id) {
            return Vec::new();
        }
        side.arrived.push(report);
        match side.waiting {
            None => Vec::new(),
            Some(Waiting::Step | Waiting::Schedule) => {
                side.waiting = None;
                self.begin_step()
            }
            Some(Waiting::All) => {
                self.take_all_arrived();
                if self.background_outstanding() == 0 {
                    self.side().waiting = None;
                    self.complete()
                } else {
                    Vec::new()
                }
            }
        }
    }

    /// Background children still out (started, report not in the history).
    pub fn background_outstanding(&self) -> usize {
        self.side.as_ref().map_or(0, |s| s.background.len())
    }

    /// Puts the reports due at this boundary into the history; returns their
    /// `backgroundDelivered` events, or `None` when a report the schedule
    /// has here has not come yet (the run waits for it). Live, every report
    /// that came is due, in the order they came; a run resumed or replayed
    /// takes each at the boundary its journal recorded (so its history is the
    /// one its recorded replies answered). A caller that checkpoints emits
    /// the events after the checkpoint, so a journal that has the event has
    /// the history with the report too.
    #[must_use]
    pub(super) fn take_arrived(&mut self) -> Option<Vec<EventKind>> {
        let step = self.step;
        let Some(side) = self.side.as_deref_mut() else {
            return Some(Vec::new());
        };
        let outstanding = &side.background;
        // A scheduled child that is not out (or a boundary already passed)
        // will never be delivered there: its entry is dropped.
        side.scheduled.retain(|s| {
            s.step > step
                || (s.step == step && outstanding.iter().any(|a| a.has_attempt(&s.child_run_id)))
        });
        let reports: Vec<ChildReport> = if side.scheduled.is_empty() {
            std::mem::take(&mut side.arrived)
        } else {
            let due: Vec<RunId> = side
                .scheduled
                .iter()
                .filter(|s| s.step == step)
                .map(|s| s.child_run_id.clone())
                .collect();
            let came = |id: &RunId| side.arrived.iter().any(|r| r.run_ids.last() == Some(id));
            if !due.iter().all(came) {
                return None;
            }
            side.scheduled.retain(|s| s.step != step);
            due.iter()
                .filter_map(|id| {
                    let at = side
                        .arrived
                        .iter()
                        .position(|r| r.run_ids.last() == Some(id))?;
                    Some(side.arrived.remove(at))
                })
                .collect()
        };
        Some(self.put_reports(reports))
    }

    /// Every report that came goes into the history now (no step will
    /// answer them: the schedule does not apply).
    pub(super) fn take_all_arrived(&mut self) {
        let reports = self.take_side(|side| &mut side.arrived);
        let delivered = self.put_reports(reports);
        self.events.extend(delivered);
    }

    fn put_reports(&mut self, reports: Vec<ChildReport>) -> Vec<EventKind> {
        let budget = self.report_budget();
        let mut delivered = Vec::new();
        for report in reports {
            if let Some(side) = self.side.as_deref_mut() {
                side.background
                    .retain(|id| Some(id) != report.agent_id.as_ref());
            }
            self.state
                .message_history
                .push(report_message(&report, budget));
            self.state.credits_used += report.credits;
            if let Some(child_run_id) = report.run_ids.last() {
                delivered.push(EventKind::BackgroundDelivered {
                    step: self.step,
                    child_run_id: child_run_id.clone(),
                });
            }
            self.state.child_run_ids.extend(report.run_ids);
        }
        delivered
    }

    /// Whether the boundary after this step delivers reports: live, when
    /// some came; resumed or replayed, when the journal delivered some here.
    pub(super) fn delivers_now(&self) -> bool {
        let Some(side) = self.side.as_deref() else {
            return false;
        };
        if side.scheduled.is_empty() {
            !side.arrived.is_empty()
        } else {
            side.scheduled.iter().any(|s| s.step == self.step)
        }
    }

    /// Gives back the deliveries a restart or a replay recorded for this
    /// run (those no checkpoint it starts from holds): each report is taken
    /// at the boundary it was taken at before.
    pub fn recover_deliveries(&mut self, deliveries: Vec<Scheduled>) {
        if !deliveries.is_empty() {
            self.side().scheduled = deliveries;
        }
    }

    /// At the end of a turn with background children still out: wait for
    /// them, or end (the driver cancels them), by `on_turn_end`.
    pub(super) fn wait_for_background(&mut self) -> Option<Vec<Action>> {
        if self.background_outstanding() == 0 || self.template.on_turn_end == OnTurnEnd::Cancel {
            return None;
        }
        self.side().waiting = Some(
            if self.program.is_some() || self.state.steps_remaining == 0 {
                Waiting::All
            } else {
                Waiting::Step
            },
        );
        Some(vec![Action::AwaitChildren])
    }

    /// Plans again the background children a checkpoint's history still
    /// waits for (a run going on after a restart): each under the agent id
    /// it was started with, from the snapshot its spawn took.
    pub(super) fn relaunch(&mut self, catalog: &dyn Catalog) -> Option<Action> {
        let waiting = outstanding(&self.state.message_history);
        if waiting.is_empty() {
            if let Some(side) = self.side.as_deref_mut() {
                side.background.clear();
            }
            return None;
        }
        self.side().background = waiting.iter().map(|o| o.agent_id.clone()).collect();
        let children = waiting
            .into_iter()
            .map(|o| {
                let plan = self.plan_again(&o, catalog);
                (o.agent_id, plan)
            })
            .collect();
        Some(Action::Relaunch { children })
    }

    fn plan_again(
        &self,
        child: &Outstanding,
        catalog: &dyn Catalog,
    ) -> Result<ChildPlan, (String, String)> {
        let named = child.request["agent_type"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let request: SpawnRequest = serde_json::from_value(child.request.clone()).map_err(|e| {
            (
                named.clone(),
                format!("Invalid input for spawn_agents_async: {e}"),
            )
        })?;
        let snapshot = std::sync::Arc::new(
            self.state
                .message_history
                .iter()
                .take(child.upto)
                .cloned()
                .collect::<History>()
                .filter_unfinished_tool_calls(),
        );
        plan_child(
            &self.template,
            request,
            &snapshot,
            &crate::spawn::Notices::default(),
            false,
            |id| catalog.template(id),
            |id| catalog.knows_agent(id),
        )
        .map_err(|e| (named, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;

    fn call(id: &str, agents: Value) -> ToolCall {
        ToolCall {
            tool_call_id: id.into(),
            tool_name: SPAWN_AGENTS_ASYNC.into(),
            input: json!({ "agents": agents }).into(),
        }
    }

    fn report(agent_id: &str) -> ChildReport {
        ChildReport {
            agent_type: "worker".into(),
            agent_name: "Worker".into(),
            agent_id: Some(agent_id.parse().unwrap()),
            run_ids: vec![agent_id.parse().unwrap()],
            status: AgentStatus::Completed,
            value: json!("done"),
            credits: 0.5,
            history: None,
            error_kind: None,
        }
    }

    #[test]
    fn the_children_a_history_waits_for_are_those_started_and_not_reported() {
        let c = call(
            "c1",
            json!([{"agent_type": "worker", "prompt": "a"}, {"agent_type": "nope"},
                   {"agent_type": "worker", "prompt": "b"}]),
        );
        let started = [
            Started::Running {
                agent_id: "t/0.1".parse().unwrap(),
                run_id: "t/0.1".parse().unwrap(),
                agent_type: "worker".into(),
                agent_name: "Worker".into(),
            },
            Started::Refused {
                agent_type: "nope".into(),
                error: "Agent type nope not found".into(),
            },
            Started::Running {
                agent_id: "t/0.2".parse().unwrap(),
                run_id: "t/0.2".parse().unwrap(),
                agent_type: "worker".into(),
                agent_name: "Worker".into(),
            },
        ];
        let entries: Vec<Value> = started.iter().map(Started::entry).collect();
        let mut history = History::new();
        history.push(Message::user("go"));
        history.push(Message::assistant(None, vec![c.clone()]));
        history.push(Message::tool_result(&c, json!(entries)));
        let waiting = outstanding(&history);
        assert_eq!(
            waiting
                .iter()
                .map(|o| o.agent_id.to_string())
                .collect::<Vec<_>>(),
            ["t/0.1", "t/0.2"]
        );
        assert_eq!(waiting[1].request["prompt"], "b");
        assert_eq!(waiting[1].upto, 2);

        history.push(report_message(&report("t/0.2"), None));
        let waiting = outstanding(&history);
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].agent_id, "t/0.1");
        history.push(report_message(&report("t/0.1"), None));
        assert!(outstanding(&history).is_empty());
    }

    #[test]
    fn a_report_message_names_its_agent_and_says_how_it_ended() {
        let m = report_message(&report("t/0.3"), None);
        assert!(m.has_tag(BACKGROUND_REPORT));
        assert_eq!(reported_agent(&m).unwrap(), "t/0.3");
        let text = m.text();
        assert!(
            text.starts_with("Background agent worker (t/0.3) finished."),
            "{text}"
        );
        let (_, body) = text.split_once('\n').unwrap();
        let entry: Value = serde_json::from_str(body).unwrap();
        assert_eq!(entry["value"], "done");
        assert_eq!(entry["status"], "completed");
        assert_eq!(entry["runId"], "t/0.3");
    }

    #[test]
    fn a_call_whose_input_came_as_text_is_read_too() {
        let c = ToolCall {
            tool_call_id: "c1".into(),
            tool_name: SPAWN_AGENTS_ASYNC.into(),
            input: json!("{\"agents\":[{\"agent_type\":\"worker\",\"prompt\":\"x\"}]}").into(),
        };
        let mut history = History::new();
        history.push(Message::assistant(None, vec![c.clone()]));
        history.push(Message::tool_result(
            &c,
            json!([{"agentId": "t/0.1", "runId": "t/0.1", "agentType": "worker"}]),
        ));
        let waiting = outstanding(&history);
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].request["prompt"], "x");
    }
}

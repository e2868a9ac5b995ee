//! Reading a tree back, whatever the backend: its segments replayed into a
//! `TreeLog` (the journal, the runs with their last checkpoint and final
//! state, the model replies), states decoded from their rows, and what the
//! `Store` port's reads give from it (a run, the final states, the journal,
//! an export, what a resume needs).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arbor_actors::approval::{AlwaysAllowed, Decision};
use arbor_actors::background::Scheduled;
use arbor_actors::state::ToolDefinitions;
use arbor_actors::steer::Steer;
use arbor_actors::{AgentState, Checkpoint, FailureKind, History, Message, RunId, Usage};
use serde_json::{Value, json};

use crate::error::Error;
use crate::recovery::{RecordedReply, Recovery, Spent};
use crate::store::encode::SEGMENT;
use crate::store::state_row::StateRow;
use crate::store::{EventType, JournalEntry, RunNode, StoredRun, TreeRecord, TreeSummary};

/// A state as a tree's segments hold it: its message ids and its state row.
pub(crate) type Point = (Vec<u64>, Value);

/// One run as a tree's segments describe it.
#[derive(Default)]
pub(crate) struct RunLog {
    pub(crate) node: Option<RunNode>,
    /// The message ids of its last checkpoint, and that checkpoint's state row.
    pub(crate) checkpoint: Option<Point>,
    /// The same for its final state.
    pub(crate) last_final: Option<Point>,
    /// Its `steered` events, in order (semantics §9).
    pub(crate) steers: Vec<Steer>,
    /// Its `backgroundDelivered` events, in order (semantics §15).
    pub(crate) deliveries: Vec<Scheduled>,
    /// Its decisions on tool calls, by call id (semantics §12).
    pub(crate) decisions: HashMap<String, Decision>,
    /// Its `PreToolUse` verdicts by call id, and its stop hooks' by
    /// `stop@STEP` (issue 36).
    pub(crate) hook_verdicts: HashMap<String, arbor_actors::lifecycle::Verdict>,
    /// Its `worktreeSealed` report (issue 36).
    pub(crate) worktree: Option<arbor_actors::worktree::WorktreeReport>,
    /// Its program's yields and tool results (issue 37).
    pub(crate) program: arbor_actors::durable::ProgramRecord,
    /// Its compactions (`historyCompacted`, issue 37), in order.
    pub(crate) compactions: Vec<arbor_actors::compact::Compacted>,
    /// Message ids of the history being rebuilt from deltas.
    ids: Vec<u64>,
    /// Where it finished among the tree's runs.
    pub(crate) finished_at: Option<usize>,
}

/// A tree read back from its segments.
pub(crate) struct TreeLog {
    tree_id: String,
    pub(crate) events: Vec<Value>,
    messages: HashMap<u64, Value>,
    pub(crate) runs: Vec<(String, RunLog)>,
    pub(crate) index: HashMap<String, usize>,
    pub(crate) replies: Vec<(String, u32, u64, Usage)>,
    /// Replies billed and not acted on (`modelResponded` with `refused`):
    /// run, step and usage, which their events carry.
    refused: Vec<(String, u32, Usage)>,
    /// What the summary calls of compactions used (`historyCompacted`).
    compacted: Vec<Usage>,
    /// The budgets raised while the tree ran, the latest of each.
    pub(crate) raised: crate::Raised,
    /// The tools a person allowed for good in the tree (`approvalRuleAdded`).
    allowed: AlwaysAllowed,
    /// The calls asked for and not decided: run and first ask, by call id.
    asked: HashMap<String, (String, u64)>,
    finished: usize,
    /// Decoded values, shared between the states built from them.
    decoded: HashMap<u64, Arc<Message>>,
    texts: HashMap<u64, Arc<str>>,
    tools: HashMap<u64, ToolDefinitions>,
}

/// A checkpoint record waiting for its state row: its run, whether it is the
/// final state, the run whose last checkpoint it starts from (its parent; by
/// default its own), how many of those ids it keeps, and the ids it appends.
struct Pending {
    run: String,
    is_final: bool,
    from: Option<String>,
    keep: Option<usize>,
    appended: Vec<u64>,
}

impl TreeLog {
    /// A tree's log from its segments' bodies, in order.
    pub(crate) fn from_segments(
        tree_id: &str,
        bodies: impl IntoIterator<Item = Result<Vec<u8>, Error>>,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<TreeLog, Error> {
        let mut log = TreeLog {
            tree_id: tree_id.to_owned(),
            events: Vec::new(),
            messages: HashMap::new(),
            runs: Vec::new(),
            index: HashMap::new(),
            replies: Vec::new(),
            refused: Vec::new(),
            compacted: Vec::new(),
            raised: crate::Raised::default(),
            allowed: AlwaysAllowed::default(),
            asked: HashMap::new(),
            finished: 0,
            decoded: HashMap::new(),
            texts: HashMap::new(),
            tools: HashMap::new(),
        };
        for body in bodies {
            TreeLog::read(decode_segment(&body?, bad)?, &mut log, bad)?;
        }
        Ok(log)
    }

    fn run(&mut self, run_id: &str) -> &mut RunLog {
        let at = match self.index.get(run_id) {
            Some(at) => *at,
            None => {
                self.runs.push((run_id.to_owned(), RunLog::default()));
                self.index.insert(run_id.to_owned(), self.runs.len() - 1);
                self.runs.len() - 1
            }
        };
        &mut self.runs[at].1
    }

    fn read(
        records: Vec<Value>,
        log: &mut TreeLog,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<(), Error> {
        let mut pending: Option<Pending> = None;
        for record in records {
            let Value::Object(mut map) = record else {
                return Err(bad("a record is not an object".into()));
            };
            if map.contains_key("seq") {
                log.event(&mut map);
                log.events.push(Value::Object(map));
            } else if let Some(id) = map.get("m").and_then(Value::as_u64) {
                if map.contains_key("b") {
                    log.messages.insert(id, map.remove("b").unwrap_or_default());
                }
                let run = map.get("r").and_then(Value::as_str).map(str::to_owned);
                if let (Some(run), Some(step)) = (run, map.get("s").and_then(Value::as_u64)) {
                    let usage: Usage = serde_json::from_value(map.remove("u").unwrap_or_default())
                        .map_err(|e| bad(format!("a model call's usage: {e}")))?;
                    log.replies.push((run.clone(), step as u32, id, usage));
                    let node = log.run(&run).node.get_or_insert_with(RunNode::default);
                    node.steps += 1;
                    node.input_tokens += usage.input_tokens;
                    node.output_tokens += usage.output_tokens;
                    node.cost += usage.cost;
                }
            } else if let Some(id) = map.get("p").and_then(Value::as_u64) {
                let text: String = serde_json::from_value(map.remove("b").unwrap_or_default())
                    .map_err(|e| bad(format!("system prompt {id}: {e}")))?;
                log.texts.insert(id, Arc::from(text));
            } else if let Some(id) = map.get("d").and_then(Value::as_u64) {
                let tools = serde_json::from_value(map.remove("b").unwrap_or_default())
                    .map_err(|e| bad(format!("tool definitions {id}: {e}")))?;
                log.tools.insert(id, Arc::new(tools));
            } else if let Some(run) = map.get("c").and_then(Value::as_str).map(str::to_owned) {
                let keep = map.get("k").and_then(Value::as_u64).map(|k| k as usize);
                let is_final = map.get("f").and_then(Value::as_bool).unwrap_or(false);
                let from = map.get("from").and_then(Value::as_str).map(str::to_owned);
                let appended: Vec<u64> =
                    serde_json::from_value(map.remove("a").unwrap_or_default())
                        .map_err(|e| bad(format!("a checkpoint of {run}: {e}")))?;
                pending = Some(Pending {
                    run,
                    is_final,
                    from,
                    keep,
                    appended,
                });
            } else if let Some(row) = map.remove("st") {
                let Some(Pending {
                    run,
                    is_final,
                    from,
                    keep,
                    appended,
                }) = pending.take()
                else {
                    return Err(bad("a state without its checkpoint".into()));
                };
                // The first `keep` ids of the parent's last checkpoint.
                let inherited = match (&from, keep) {
                    (Some(parent), Some(keep)) => {
                        let ids = log.index.get(parent).map(|at| &log.runs[*at].1.ids);
                        match ids.and_then(|ids| ids.get(..keep)) {
                            Some(ids) => Some(ids.to_vec()),
                            None => {
                                return Err(bad(format!(
                                    "a checkpoint of {run} keeps {keep} messages of {parent}, \
                                     which has fewer"
                                )));
                            }
                        }
                    }
                    _ => None,
                };
                let finished = log.finished;
                let r = log.run(&run);
                match (inherited, keep) {
                    (Some(ids), _) => r.ids = ids,
                    (None, Some(keep)) => r.ids.truncate(keep),
                    (None, None) => r.ids.clear(),
                }
                r.ids.extend(appended);
                if is_final {
                    r.last_final = Some((r.ids.clone(), row));
                    r.finished_at = Some(finished);
                    r.ids.clear();
                    log.finished += 1;
                } else {
                    r.checkpoint = Some((r.ids.clone(), row));
                }
            } else {
                return Err(bad("a record of an unknown kind".into()));
            }
        }
        Ok(())
    }

    /// What the journal says of a run (and a final event gets back the output
    /// that is stored once, with the final state).
    fn event(&mut self, e: &mut serde_json::Map<String, Value>) {
        let Some(run_id) = e.get("runId").and_then(Value::as_str) else {
            return;
        };
        let at = e.get("atMs").and_then(Value::as_u64).unwrap_or(0);
        let str_of = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
        let kind = e.get("type").and_then(Value::as_str);
        match kind.and_then(|kind| kind.parse::<EventType>().ok()) {
            Some(EventType::LimitsRaised) => {
                let raised = crate::Raised {
                    max_steps: e.get("maxSteps").and_then(Value::as_u64),
                    max_tokens: e.get("maxTokens").and_then(Value::as_u64),
                    max_credits: e.get("maxCredits").and_then(Value::as_f64),
                };
                self.raised = self.raised.then(raised);
            }
            Some(EventType::ApprovalRuleAdded) => {
                if let Some(tool) = e.get("tool").and_then(Value::as_str) {
                    self.allowed.add(tool);
                }
            }
            Some(EventType::ApprovalRequested) => {
                let id = str_of("toolCallId").unwrap_or_default();
                self.asked
                    .entry(id)
                    .or_insert_with(|| (run_id.to_owned(), at));
            }
            Some(EventType::HookDecided) => {
                // A call's PreToolUse verdict (by its call id) and a stop
                // hook's (by `stop@STEP`) are taken again on resume.
                // (A PostToolUse verdict is in the call's result already.)
                let resumed = matches!(
                    e.get("hook").and_then(Value::as_str),
                    Some(
                        "PreToolUse"
                            | "Stop"
                            | "SubagentStop"
                            | "UserPromptSubmit"
                            | "SubagentStart"
                    )
                );
                if let (true, Some(id)) = (resumed, str_of("toolCallId"))
                    && let Some(verdict) = e.get("verdict").and_then(|v| {
                        <arbor_actors::lifecycle::Verdict as serde::Deserialize>::deserialize(v)
                            .ok()
                    })
                {
                    self.run(run_id).hook_verdicts.insert(id, verdict);
                }
            }
            // A compaction, applied again from its record on resume and
            // replay; its summary call's usage counts as the run's (once:
            // one applied from the record has none).
            Some(EventType::HistoryCompacted) => {
                if let Ok(compacted) = serde_json::from_value::<arbor_actors::compact::Compacted>(
                    Value::Object(e.clone()),
                ) {
                    let usage = compacted.usage;
                    if usage.total_tokens() > 0 || usage.cost > 0.0 {
                        let node = self.run(run_id).node.get_or_insert_with(RunNode::default);
                        node.input_tokens += usage.input_tokens;
                        node.output_tokens += usage.output_tokens;
                        node.cost += usage.cost;
                        self.compacted.push(usage);
                    }
                    let recorded = &mut self.run(run_id).compactions;
                    if !recorded.iter().any(|c| c.step == compacted.step) {
                        recorded.push(compacted);
                    }
                }
            }
            Some(EventType::ProgramYielded) => {
                if let Ok(recorded) = serde_json::from_value::<arbor_actors::durable::RecordedYield>(
                    Value::Object(e.clone()),
                ) {
                    self.run(run_id).program.push_yield(recorded);
                }
            }
            // A program's tool result, given back to its resumed run.
            Some(EventType::ToolCalled) if e.contains_key("result") => {
                let message = e
                    .get("result")
                    .and_then(|m| serde_json::from_value::<Message>(m.clone()).ok());
                if let (Some(id), Some(message)) = (str_of("toolCallId"), message) {
                    self.run(run_id)
                        .program
                        .results
                        .insert(id, Arc::new(message));
                }
            }
            Some(EventType::WorktreeSealed) => {
                if let Some(report) = e.get("report").and_then(|v| {
                    <arbor_actors::worktree::WorktreeReport as serde::Deserialize>::deserialize(v)
                        .ok()
                }) {
                    self.run(run_id).worktree = Some(report);
                }
            }
            Some(EventType::ApprovalDecided) => {
                let id = str_of("toolCallId").unwrap_or_default();
                self.asked.remove(&id);
                let decision = e
                    .get("decision")
                    .and_then(|d| serde_json::from_value::<Decision>(d.clone()).ok());
                if let Some(decision) = decision {
                    self.run(run_id).decisions.insert(id, decision);
                }
            }
            Some(EventType::BackgroundDelivered) => {
                let step = e.get("step").and_then(Value::as_u64).unwrap_or(0) as u32;
                // A delivery of no run (none is journaled) has no place to go.
                if let Some(Ok(child_run_id)) = str_of("childRunId").map(|id| id.parse()) {
                    self.run(run_id)
                        .deliveries
                        .push(Scheduled { step, child_run_id });
                }
            }
            Some(EventType::Steered) => {
                let step = e.get("step").and_then(Value::as_u64).unwrap_or(0) as u32;
                let text: Arc<str> = e.get("text").and_then(Value::as_str).unwrap_or("").into();
                self.run(run_id).steers.push(Steer { step, text });
            }
            // Billed and not acted on: no reply is recorded, the event has
            // the usage, which counts as the run's.
            Some(EventType::ModelResponded) if e.get("refused") == Some(&Value::Bool(true)) => {
                let step = e.get("step").and_then(Value::as_u64).unwrap_or(0) as u32;
                let usage: Usage = e
                    .get("usage")
                    .and_then(|u| serde_json::from_value(u.clone()).ok())
                    .unwrap_or_default();
                let node = self.run(run_id).node.get_or_insert_with(RunNode::default);
                node.steps += 1;
                node.input_tokens += usage.input_tokens;
                node.output_tokens += usage.output_tokens;
                node.cost += usage.cost;
                self.refused.push((run_id.to_owned(), step, usage));
            }
            Some(EventType::ModelResponded) if !e.contains_key("usage") => {
                let step = e.get("step").and_then(Value::as_u64).unwrap_or(0) as u32;
                let usage = self
                    .replies
                    .iter()
                    .rev()
                    .find(|(run, s, _, _)| run == run_id && *s == step)
                    .map(|(_, _, _, usage)| json!(usage))
                    .unwrap_or(Value::Null);
                // Where the event has it: after the step (as a record that
                // kept its usage has it).
                let at = e.keys().position(|k| k == "step").map_or(1, |i| i + 1);
                e.shift_insert(at, "usage".into(), usage);
            }
            Some(EventType::AgentStarted) => {
                let node = self.run(run_id).node.get_or_insert_with(RunNode::default);
                node.run_id = run_id.to_owned();
                node.parent_run_id = str_of("parentRunId");
                node.agent_type = str_of("agentType").unwrap_or_default();
                node.depth = e.get("depth").and_then(Value::as_u64).unwrap_or(0);
                node.status = "running".into();
                node.error = None;
                node.error_kind = None;
                node.finished_ms = None;
                if node.started_ms == 0 {
                    node.started_ms = at;
                }
            }
            Some(EventType::AgentFinished | EventType::AgentFailed | EventType::AgentCancelled) => {
                let (status, error) = (str_of("status"), str_of("error"));
                let kind = e
                    .get("errorKind")
                    .and_then(|k| serde_json::from_value::<FailureKind>(k.clone()).ok());
                let run_id = run_id.to_owned();
                let r = self.run(&run_id);
                let output = r
                    .last_final
                    .as_ref()
                    .and_then(|(_, row)| StateRow::output_of(row).cloned())
                    .unwrap_or(Value::Null);
                let node = r.node.get_or_insert_with(RunNode::default);
                node.run_id = run_id;
                node.status = status.unwrap_or_default();
                node.error = error;
                node.error_kind = kind;
                node.finished_ms = Some(at);
                e.insert("output".into(), output);
            }
            _ => {}
        }
    }

    pub(crate) fn message(
        &mut self,
        id: u64,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<Arc<Message>, Error> {
        if let Some(m) = self.decoded.get(&id) {
            return Ok(m.clone());
        }
        let body = self
            .messages
            .get(&id)
            .ok_or_else(|| bad(format!("message {id} is missing")))?;
        let message: Message = serde_json::from_value(body.clone())
            .map_err(|e| bad(format!("message {id} is not valid: {e}")))?;
        let message = Arc::new(message);
        self.decoded.insert(id, message.clone());
        Ok(message)
    }

    pub(crate) fn state(
        &mut self,
        (ids, row): &Point,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<Checkpoint, Error> {
        let row = StateRow::read(row).map_err(|e| bad(format!("a state is not valid: {e}")))?;
        let mut history = History::new();
        for id in ids {
            history.push_shared(self.message(*id, bad)?);
        }
        let system_prompt = self
            .texts
            .get(&row.system_prompt)
            .cloned()
            .ok_or_else(|| bad(format!("system prompt {} is missing", row.system_prompt)))?;
        let tool_definitions = self
            .tools
            .get(&row.tool_definitions)
            .cloned()
            .ok_or_else(|| {
                bad(format!(
                    "tool definitions {} are missing",
                    row.tool_definitions
                ))
            })?;
        row.into_checkpoint(&self.tree_id, history, system_prompt, tool_definitions)
            .map_err(|e| bad(format!("a state is not valid: {e}")))
    }

    pub(crate) fn nodes(&self) -> Vec<RunNode> {
        self.runs
            .iter()
            .filter_map(|(_, r)| r.node.clone())
            .filter(|n| !n.run_id.is_empty())
            .collect()
    }
}

impl Default for RunNode {
    fn default() -> Self {
        RunNode {
            run_id: String::new(),
            parent_run_id: None,
            agent_type: String::new(),
            depth: 0,
            status: "running".into(),
            error: None,
            error_kind: None,
            steps: 0,
            input_tokens: 0,
            output_tokens: 0,
            cost: 0.0,
            started_ms: 0,
            finished_ms: None,
        }
    }
}

/// A segment's records: its body decompressed and parsed.
pub(crate) fn decode_segment(
    body: &[u8],
    bad: &dyn Fn(String) -> Error,
) -> Result<Vec<Value>, Error> {
    // A segment is at most a few MiB; a size prefix claiming more is
    // corruption, not something to allocate.
    let claimed = body
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .unwrap_or(usize::MAX);
    if claimed > 64 * SEGMENT {
        return Err(bad("a segment is corrupt (its size is out of range)".into()));
    }
    let json = lz4_flex::decompress_size_prepended(body)
        .map_err(|e| bad(format!("a segment is corrupt: {e}")))?;
    serde_json::from_slice(&json).map_err(|e| bad(format!("a segment is not valid: {e}")))
}

impl TreeLog {
    /// `Store::run`: one run with its final state or last checkpoint.
    pub(crate) fn stored_run(
        mut self,
        run_id: &RunId,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<StoredRun, Error> {
        let Some(&at) = self.index.get(run_id.to_string().as_str()) else {
            return Err(Error::UnknownRun(run_id.clone()));
        };
        let run = &self.runs[at].1;
        let node = run
            .node
            .clone()
            .filter(|n| !n.run_id.is_empty())
            .ok_or_else(|| Error::UnknownRun(run_id.clone()))?;
        let (point, is_final) = match (&run.last_final, &run.checkpoint) {
            (Some(f), _) => (Some(f.clone()), true),
            (None, Some(c)) => (Some(c.clone()), false),
            (None, None) => (None, false),
        };
        let checkpoint = point.map(|p| self.state(&p, bad)).transpose()?;
        let inherited = checkpoint.as_ref().map_or(0, |c| c.inherited);
        Ok(StoredRun {
            node,
            state: checkpoint.map(|c| c.state),
            is_final,
            inherited,
        })
    }

    /// `Store::final_states`: in the order the runs finished.
    pub(crate) fn final_states(
        mut self,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<Vec<AgentState>, Error> {
        let mut finals: Vec<(usize, Point)> = self
            .runs
            .iter()
            .filter_map(|(_, r)| Some((r.finished_at?, r.last_final.clone()?)))
            .collect();
        finals.sort_by_key(|(at, _)| *at);
        finals
            .into_iter()
            .map(|(_, point)| self.state(&point, bad).map(|c| c.state))
            .collect()
    }

    /// `Store::events`: the journal after `after`.
    pub(crate) fn journal(
        self,
        after: u64,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<Vec<JournalEntry>, Error> {
        let mut entries = Vec::new();
        for event in self.events {
            let Value::Object(record) = event else {
                return Err(bad("an event is not an object".into()));
            };
            // Judged on the record: only the events asked for are converted
            // (one without a whole-number `seq` is, to be refused).
            if record
                .get("seq")
                .and_then(Value::as_u64)
                .is_some_and(|seq| seq <= after)
            {
                continue;
            }
            let entry = JournalEntry::from_record(record).map_err(|e| bad(e.to_string()))?;
            entries.push(entry);
        }
        Ok(entries)
    }

    /// `Store::export`: everything stored of the tree, as one JSON document.
    pub(crate) fn export(
        mut self,
        record: TreeRecord,
        summary: TreeSummary,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<Value, Error> {
        let mut runs = Vec::new();
        let points: Vec<(Option<RunNode>, bool, Option<Point>)> = self
            .runs
            .iter()
            .map(|(_, r)| {
                let point = r.last_final.clone().or_else(|| r.checkpoint.clone());
                (r.node.clone(), r.last_final.is_some(), point)
            })
            .collect();
        for (node, is_final, point) in points {
            let state = point.map(|p| self.state(&p, bad)).transpose()?;
            runs.push(json!({"run": node, "final": is_final, "state": state.map(|c| c.state)}));
        }
        let mut model_calls = Vec::new();
        for (run_id, step, id, usage) in self.replies.clone() {
            model_calls.push(json!({
                "runId": run_id, "step": step, "reply": *self.message(id, bad)?, "usage": usage,
            }));
        }
        Ok(json!({
            "tree": record,
            "summary": summary,
            "runs": runs,
            "events": self.events,
            "modelCalls": model_calls,
        }))
    }

    /// `Store::recovery`: what a resume of the tree goes on from
    /// (`last_seq`: the row's).
    pub(crate) fn recovery(
        mut self,
        tree_id: &str,
        last_seq: u64,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<Recovery, Error> {
        let log = &mut self;
        let bad = |reason: String| bad(reason);
        let mut recovery = Recovery::default();
        let mut agents = HashSet::new();
        let runs: Vec<(String, Option<Point>, Option<Point>)> = log
            .runs
            .iter()
            .map(|(id, r)| (id.clone(), r.last_final.clone(), r.checkpoint.clone()))
            .collect();
        for (id, r) in &log.runs {
            if !r.deliveries.is_empty() {
                recovery.deliveries.insert(id.clone(), r.deliveries.clone());
            }
            if !r.steers.is_empty() {
                recovery.steers.insert(id.clone(), r.steers.clone());
            }
            if !r.decisions.is_empty() {
                recovery.decisions.insert(id.clone(), r.decisions.clone());
            }
            if !r.hook_verdicts.is_empty() {
                recovery
                    .hook_verdicts
                    .insert(id.clone(), r.hook_verdicts.clone());
            }
            if let Some(report) = &r.worktree {
                recovery.worktrees.insert(id.clone(), report.clone());
            }
            if !r.program.is_empty() {
                recovery.programs.insert(id.clone(), r.program.clone());
            }
            if !r.compactions.is_empty() {
                recovery
                    .compactions
                    .insert(id.clone(), r.compactions.clone());
            }
        }
        for (run_id, last_final, checkpoint) in runs {
            if let Some(point) = last_final {
                // Its output depends on how much of its final history it
                // inherited, which the final record keeps.
                let last = log.state(&point, &bad)?;
                agents.insert(last.state.agent_id.to_string());
                recovery
                    .finished
                    .insert(run_id.clone(), (Arc::new(last.state), last.inherited));
            } else if let Some(point) = checkpoint {
                let checkpoint = log.state(&point, &bad)?;
                agents.insert(checkpoint.state.agent_id.to_string());
                recovery
                    .checkpoints
                    .insert(run_id.clone(), Arc::new(checkpoint));
            }
            recovery.runs.push(run_id);
        }
        // The root counts even when nothing of it is stored yet.
        agents.insert(format!("{tree_id}/0"));
        recovery.raised = log.raised;
        recovery.allowed = std::mem::take(&mut log.allowed);
        recovery.asked = std::mem::take(&mut log.asked);
        let mut spent = Spent {
            agents: agents.len(),
            ..Spent::default()
        };
        let replies = std::mem::take(&mut log.replies);
        for (run_id, step, id, usage) in replies {
            // What will not be asked again counts as spent; a reply served again
            // on resume is counted when it is served.
            let done = recovery.finished.contains_key(&run_id)
                || recovery
                    .checkpoints
                    .get(&run_id)
                    .is_some_and(|c| step <= c.step);
            if done {
                spent.steps += 1;
                spent.tokens += usage.input_tokens + usage.output_tokens;
                spent.credits += usage.cost;
            }
            let message = log.message(id, &bad)?;
            recovery
                .replies
                .insert((run_id, step), RecordedReply { message, usage });
        }
        // A reply billed and not acted on is never served again: spent.
        for (_, _, usage) in std::mem::take(&mut log.refused) {
            spent.steps += 1;
            spent.tokens += usage.input_tokens + usage.output_tokens;
            spent.credits += usage.cost;
        }
        // A summary call is never made again (its record is applied).
        for usage in std::mem::take(&mut log.compacted) {
            spent.steps += 1;
            spent.tokens += usage.input_tokens + usage.output_tokens;
            spent.credits += usage.cost;
        }
        recovery.spent = spent;
        recovery.message_ids = log.decoded.iter().map(|(id, m)| (m.clone(), *id)).collect();
        recovery.last_seq = last_seq;
        Ok(recovery)
    }
}

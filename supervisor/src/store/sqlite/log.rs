//! Reading a tree back: its segments replayed into a `TreeLog` (the journal,
//! the runs with their last checkpoint and final state, the model replies),
//! states decoded from their rows, and what a resume needs (`Recovery`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arbor_actors::approval::Decision;
use arbor_actors::background::Scheduled;
use arbor_actors::state::ToolDefinitions;
use arbor_actors::steer::Steer;
use arbor_actors::{AgentState, AgentStatus, Checkpoint, FailureKind, History, Message, Usage};
use rusqlite::{Connection, OptionalExtension};
use serde::Deserialize;
use serde_json::{Value, json};

use super::write::{OUTPUT_AT, SEGMENT};
use super::{SqliteStore, sql};
use crate::error::Error;
use crate::recovery::{RecordedReply, Recovery, Spent};
use crate::store::RunNode;

#[derive(Deserialize)]
struct StateRowOwned(
    Option<String>,
    Option<String>,
    String,
    Option<String>,
    Vec<String>,
    Vec<String>,
    Option<Value>,
    u64,
    u64,
    u64,
    u32,
    f64,
    f64,
    AgentStatus,
    u32,
    u32,
    usize,
    Option<FailureKind>,
);

/// How many fields a state row had before it kept the failure's kind (a
/// row a build before that wrote; it is read with no kind).
const STATE_ROW_BEFORE_KINDS: usize = 17;

/// A state as a tree's segments hold it: its message ids and its state row.
pub(super) type Point = (Vec<u64>, Value);

/// One run as a tree's segments describe it.
#[derive(Default)]
pub(super) struct RunLog {
    pub(super) node: Option<RunNode>,
    /// The message ids of its last checkpoint, and that checkpoint's state row.
    pub(super) checkpoint: Option<Point>,
    /// The same for its final state.
    pub(super) last_final: Option<Point>,
    /// Its `steered` events, in order (semantics §9).
    pub(super) steers: Vec<Steer>,
    /// Its `backgroundDelivered` events, in order (semantics §15).
    pub(super) deliveries: Vec<Scheduled>,
    /// Its decisions on tool calls, by call id (semantics §12).
    pub(super) decisions: HashMap<String, Decision>,
    /// Message ids of the history being rebuilt from deltas.
    ids: Vec<u64>,
    /// Where it finished among the tree's runs.
    pub(super) finished_at: Option<usize>,
}

/// A tree read back from its segments.
pub(super) struct TreeLog {
    tree_id: String,
    pub(super) events: Vec<Value>,
    messages: HashMap<u64, Value>,
    pub(super) runs: Vec<(String, RunLog)>,
    pub(super) index: HashMap<String, usize>,
    pub(super) replies: Vec<(String, u32, u64, Usage)>,
    /// The budgets raised while the tree ran, the latest of each.
    pub(super) raised: crate::Raised,
    finished: usize,
    /// Decoded values, shared between the states built from them.
    decoded: HashMap<u64, Arc<Message>>,
    texts: HashMap<u64, Arc<str>>,
    tools: HashMap<u64, ToolDefinitions>,
}

impl TreeLog {
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
        let mut pending: Option<(String, bool, Option<usize>, Vec<u64>)> = None;
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
                let appended: Vec<u64> =
                    serde_json::from_value(map.remove("a").unwrap_or_default())
                        .map_err(|e| bad(format!("a checkpoint of {run}: {e}")))?;
                pending = Some((run, is_final, keep, appended));
            } else if let Some(row) = map.remove("st") {
                let Some((run, is_final, keep, appended)) = pending.take() else {
                    return Err(bad("a state without its checkpoint".into()));
                };
                let finished = log.finished;
                let r = log.run(&run);
                match keep {
                    Some(keep) => r.ids.truncate(keep),
                    None => r.ids.clear(),
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
        match e.get("type").and_then(Value::as_str) {
            Some("limitsRaised") => {
                let raised = crate::Raised {
                    max_steps: e.get("maxSteps").and_then(Value::as_u64),
                    max_tokens: e.get("maxTokens").and_then(Value::as_u64),
                    max_credits: e.get("maxCredits").and_then(Value::as_f64),
                };
                self.raised = self.raised.then(raised);
            }
            Some("approvalDecided") => {
                let id = str_of("toolCallId").unwrap_or_default();
                let decision = e
                    .get("decision")
                    .and_then(|d| serde_json::from_value::<Decision>(d.clone()).ok());
                if let Some(decision) = decision {
                    self.run(run_id).decisions.insert(id, decision);
                }
            }
            Some("backgroundDelivered") => {
                let step = e.get("step").and_then(Value::as_u64).unwrap_or(0) as u32;
                let child_run_id = str_of("childRunId").unwrap_or_default();
                self.run(run_id)
                    .deliveries
                    .push(Scheduled { step, child_run_id });
            }
            Some("steered") => {
                let step = e.get("step").and_then(Value::as_u64).unwrap_or(0) as u32;
                let text: Arc<str> = e.get("text").and_then(Value::as_str).unwrap_or("").into();
                self.run(run_id).steers.push(Steer { step, text });
            }
            Some("modelResponded") if !e.contains_key("usage") => {
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
            Some("agentStarted") => {
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
            Some("agentFinished" | "agentFailed" | "agentCancelled") => {
                let (status, error) = (str_of("status"), str_of("error"));
                let kind = e
                    .get("errorKind")
                    .and_then(|k| serde_json::from_value::<FailureKind>(k.clone()).ok());
                let run_id = run_id.to_owned();
                let r = self.run(&run_id);
                let output = r
                    .last_final
                    .as_ref()
                    .and_then(|(_, row)| row.get(OUTPUT_AT).cloned())
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

    pub(super) fn message(
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

    pub(super) fn state(
        &mut self,
        (ids, row): &Point,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<Checkpoint, Error> {
        let StateRowOwned(
            agent_id,
            agent_type,
            run_id,
            parent_id,
            ancestor_run_ids,
            child_run_ids,
            output,
            system_prompt,
            tool_definitions,
            context_token_count,
            steps_remaining,
            credits_used,
            direct_credits_used,
            status,
            step,
            children_spawned,
            inherited,
            error_kind,
        ) = match row {
            Value::Array(fields) if fields.len() == STATE_ROW_BEFORE_KINDS => {
                let mut fields = fields.clone();
                fields.push(Value::Null);
                serde_json::from_value(Value::Array(fields))
            }
            row => serde_json::from_value(row.clone()),
        }
        .map_err(|e| bad(format!("a state is not valid: {e}")))?;
        let full = |id: String| {
            if id.contains('/') {
                id
            } else {
                format!("{}/{id}", self.tree_id)
            }
        };
        let (agent_id, run_id, parent_id) = (agent_id.map(full), full(run_id), parent_id.map(full));
        let ancestor_run_ids: Vec<String> = ancestor_run_ids.into_iter().map(full).collect();
        let child_run_ids: Vec<String> = child_run_ids.into_iter().map(full).collect();
        let mut history = History::new();
        for id in ids {
            history.push_shared(self.message(*id, bad)?);
        }
        let system_prompt = self
            .texts
            .get(&system_prompt)
            .cloned()
            .ok_or_else(|| bad(format!("system prompt {system_prompt} is missing")))?;
        let tool_definitions = self
            .tools
            .get(&tool_definitions)
            .cloned()
            .ok_or_else(|| bad(format!("tool definitions {tool_definitions} are missing")))?;
        Ok(Checkpoint {
            step,
            children_spawned,
            inherited,
            state: AgentState {
                agent_id: agent_id.unwrap_or_else(|| run_id.clone()),
                agent_type,
                parent_id: parent_id.or_else(|| ancestor_run_ids.last().cloned()),
                run_id,
                ancestor_run_ids,
                child_run_ids,
                message_history: history,
                output,
                system_prompt,
                tool_definitions,
                context_token_count,
                steps_remaining,
                credits_used,
                direct_credits_used,
                status,
                error_kind,
            },
        })
    }

    pub(super) fn nodes(&self) -> Vec<RunNode> {
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

impl SqliteStore {
    /// Reads every segment of a tree.
    pub(super) fn log(&self, conn: &Connection, tree_id: &str) -> Result<TreeLog, Error> {
        let found: Option<i64> = conn
            .query_row("SELECT 1 FROM trees WHERE tree_id = ?1", [tree_id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql(&self.path))?;
        if found.is_none() {
            return Err(Error::UnknownTree(tree_id.to_owned()));
        }
        let bad = self.bad(tree_id);
        let mut stmt = conn
            .prepare_cached("SELECT body FROM segments WHERE tree_id = ?1 ORDER BY n")
            .map_err(sql(&self.path))?;
        let bodies = stmt
            .query_map([tree_id], |r| r.get::<_, Vec<u8>>(0))
            .map_err(sql(&self.path))?;
        let mut log = TreeLog {
            tree_id: tree_id.to_owned(),
            events: Vec::new(),
            messages: HashMap::new(),
            runs: Vec::new(),
            index: HashMap::new(),
            replies: Vec::new(),
            raised: crate::Raised::default(),
            finished: 0,
            decoded: HashMap::new(),
            texts: HashMap::new(),
            tools: HashMap::new(),
        };
        for body in bodies {
            let body = body.map_err(sql(&self.path))?;
            // A segment is at most a few MiB; a size prefix claiming more is
            // corruption, not something to allocate.
            let claimed = body
                .get(..4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                .unwrap_or(usize::MAX);
            if claimed > 64 * SEGMENT {
                return Err(bad("a segment is corrupt (its size is out of range)".into()));
            }
            let json = lz4_flex::decompress_size_prepended(&body)
                .map_err(|e| bad(format!("a segment is corrupt: {e}")))?;
            let records: Vec<Value> = serde_json::from_slice(&json)
                .map_err(|e| bad(format!("a segment is not valid: {e}")))?;
            TreeLog::read(records, &mut log, &bad)?;
        }
        Ok(log)
    }

    pub(super) fn bad(&self, tree_id: &str) -> impl Fn(String) -> Error + use<> {
        let path = self.path.display().to_string();
        let tree_id = tree_id.to_owned();
        move |reason| Error::StoreCorrupt {
            path: path.clone(),
            tree: tree_id.clone(),
            reason,
        }
    }
}

impl SqliteStore {
    /// `Store::recovery`: what a resume of the tree goes on from.
    pub(super) fn load_recovery(&self, tree_id: &str) -> Result<Recovery, Error> {
        let conn = self.conn()?;
        let mut log = self.log(&conn, tree_id)?;
        let bad = self.bad(tree_id);
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
        }
        for (run_id, last_final, checkpoint) in runs {
            if let Some(point) = last_final {
                // Its output depends on how much of its final history it
                // inherited, which the final record keeps.
                let last = log.state(&point, &bad)?;
                agents.insert(last.state.agent_id.clone());
                recovery
                    .finished
                    .insert(run_id.clone(), (Arc::new(last.state), last.inherited));
            } else if let Some(point) = checkpoint {
                let checkpoint = log.state(&point, &bad)?;
                agents.insert(checkpoint.state.agent_id.clone());
                recovery
                    .checkpoints
                    .insert(run_id.clone(), Arc::new(checkpoint));
            }
            recovery.runs.push(run_id);
        }
        // The root counts even when nothing of it is stored yet.
        agents.insert(format!("{tree_id}/0"));
        recovery.raised = log.raised;
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
        recovery.spent = spent;
        recovery.message_ids = log.decoded.iter().map(|(id, m)| (m.clone(), *id)).collect();
        recovery.last_seq = conn
            .query_row(
                "SELECT last_seq FROM trees WHERE tree_id = ?1",
                [tree_id],
                |r| r.get::<_, i64>(0),
            )
            .map_err(sql(&self.path))? as u64;
        Ok(recovery)
    }
}

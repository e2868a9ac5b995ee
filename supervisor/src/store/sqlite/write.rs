//! The write path: one batch in one transaction, the writer's cache of what
//! each tree has been given (to write only what is new), the segment
//! encoding, and the fencing check of every tree a batch touches.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use arbor_actors::state::ToolDefinitions;
use arbor_actors::{AgentState, AgentStatus, Event, EventKind, FailureKind, History, Message};
use rusqlite::{Connection, OptionalExtension, Transaction, params};
use serde::Serialize;
use serde_json::{Value, json};

use super::SqliteStore;
use super::schema::is_busy;
use crate::error::Error;
use crate::store::journal::journal_body;
use crate::store::{Fenced, TreeStatus, Write};
use crate::tree::now_ms;

/// The key of a config text in `configs`.
fn config_hash(text: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Batches tried when another process keeps the file locked (each try waits
/// up to `BUSY_TIMEOUT`).
const BUSY_RETRIES: u64 = 6;

/// A checkpoint chain longer than this is cut with a full list of message ids.
const MAX_CHAIN: u32 = 256;

/// Bytes of JSON after which a segment is closed and a new one begun.
pub(super) const SEGMENT: usize = 256 * 1024;

/// Hashes an address (the key of the writer's caches): one multiply, instead
/// of SipHash on every message.
#[derive(Default, Clone, Copy)]
struct AddressHasher(u64);

impl std::hash::Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
}

type ByAddress<V> = HashMap<usize, V, std::hash::BuildHasherDefault<AddressHasher>>;

/// What the writer remembers of a tree it is writing, to write only what is new.
#[derive(Default)]
pub(super) struct TreeCache {
    root_run_id: String,
    next_id: u64,
    segments: u64,
    /// Ids of shared values, by address; the value is kept alive so the address
    /// cannot be reused while it is in the map.
    messages: ByAddress<(Arc<Message>, u64)>,
    texts: ByAddress<(Arc<str>, u64)>,
    tools: ByAddress<(ToolDefinitions, u64)>,
    /// Per live run: the history of its last checkpoint and the chain length.
    last: HashMap<Arc<str>, (History, u32)>,
    /// Model calls recorded before this process resumed the tree: served
    /// again from the record, they are not written (or counted) twice. Empty
    /// for a tree started here (a call is never answered twice in one life).
    calls: HashSet<(Arc<str>, u32)>,
    /// Runs that started before this process resumed the tree: starting
    /// again, they are not counted again (each leaves the set as it does).
    started: HashSet<Arc<str>>,
    /// Messages held after the last sweep.
    swept: usize,
}

impl TreeCache {
    /// Forgets messages nothing else holds any more: they can never be seen
    /// again, so their ids are not needed (amortised: runs when the map has
    /// doubled since the last sweep).
    fn sweep(&mut self) {
        if self.messages.len() < 65_536 || self.messages.len() < 2 * self.swept {
            return;
        }
        self.messages.retain(|_, (m, _)| Arc::strong_count(m) > 1);
        self.texts.retain(|_, (t, _)| Arc::strong_count(t) > 1);
        self.tools.retain(|_, (t, _)| Arc::strong_count(t) > 1);
        self.swept = self.messages.len();
    }
}

/// What a batch adds to a tree's row.
#[derive(Default)]
struct TreeDelta {
    last_seq: u64,
    agents: u64,
    input_tokens: u64,
    output_tokens: u64,
    cost: f64,
    end: Option<(TreeStatus, Option<String>, u64)>,
    segment: Vec<u8>,
}

/// A state as a checkpoint record keeps it: a JSON array (no key names), its
/// history and shared values by id. Fields, in order: agent id (null when it is
/// the run id), agent type, run id, parent id (null when it is the last
/// ancestor), ancestor run ids, child run ids, output, system prompt id, tool
/// definitions id, context tokens, steps remaining, credits, direct credits,
/// status, step, children spawned, inherited. Ids of the tree's own runs are
/// kept without the `TREE/` every one of them starts with.
#[derive(Serialize)]
struct StateRow<'a>(
    Option<&'a str>,
    &'a Option<String>,
    &'a str,
    Option<&'a str>,
    Vec<&'a str>,
    Vec<&'a str>,
    &'a Option<Value>,
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

/// Where a `StateRow` keeps the output.
pub(super) const OUTPUT_AT: usize = 6;

fn json_err(e: serde_json::Error) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(e))
}

/// One segment being filled: appends records as JSON array elements.
struct Records<'a>(&'a mut Vec<u8>);

impl Records<'_> {
    fn open(&mut self) {
        self.0.push(if self.0.is_empty() { b'[' } else { b',' });
    }

    fn value<T: Serialize + ?Sized>(&mut self, value: &T) -> rusqlite::Result<()> {
        serde_json::to_writer(&mut *self.0, value).map_err(json_err)
    }

    fn raw(&mut self, text: &str) {
        self.0.extend_from_slice(text.as_bytes());
    }
}

/// The writer's side: one batch in one transaction.
struct Batch<'a, 'c> {
    cache: &'a mut HashMap<Arc<str>, TreeCache>,
    deltas: HashMap<Arc<str>, TreeDelta>,
    /// Segments closed during the batch: (tree, JSON array).
    closed: Vec<(Arc<str>, Vec<u8>)>,
    buffers: &'a mut Buffers,
    /// The epochs this process holds (before this batch); 0 for a tree it
    /// wrote without holding a claim (it is then fenced out at once).
    claims: &'c HashMap<Arc<str>, u64>,
    /// Claims made by this batch, held once it commits.
    claimed: HashMap<Arc<str>, u64>,
    /// Trees looked at in this batch: whether this process still holds them.
    held: HashMap<Arc<str>, bool>,
    /// Trees another process claimed since this one did.
    fenced: Vec<Fenced>,
}

impl Batch<'_, '_> {
    /// Whether this process may still write `tree_id`: the row keeps the
    /// epoch it claimed the tree with. Looked up once per tree per batch (the
    /// batch holds the write lock, so the row cannot change meanwhile). A tree
    /// this store never claimed (written through the port directly) is not
    /// fenced.
    fn holds(&mut self, tx: &Transaction<'_>, tree_id: &str) -> rusqlite::Result<bool> {
        if let Some(held) = self.held.get(tree_id) {
            return Ok(*held);
        }
        let tree: Arc<str> = Arc::from(tree_id);
        let Some(&epoch) = self
            .claimed
            .get(tree_id)
            .or_else(|| self.claims.get(tree_id))
        else {
            self.held.insert(tree, true);
            return Ok(true);
        };
        let row: Option<(i64, String)> = tx
            .prepare_cached("SELECT epoch, owner FROM trees WHERE tree_id = ?1")?
            .query_row([tree_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let held = match row {
            Some((current, _)) if current as u64 == epoch && epoch != 0 => true,
            row => {
                let (current, owner) = row.unwrap_or((0, String::new()));
                self.fenced.push(Fenced {
                    tree_id: tree_id.to_owned(),
                    epoch,
                    current: current as u64,
                    owner,
                });
                false
            }
        };
        self.held.insert(tree, held);
        Ok(held)
    }

    fn tree<'t>(
        cache: &'t mut HashMap<Arc<str>, TreeCache>,
        tx: &Transaction<'_>,
        tree_id: &Arc<str>,
    ) -> rusqlite::Result<&'t mut TreeCache> {
        match cache.entry(tree_id.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => {
                // A tree this process has not seen (it started elsewhere): go
                // on from what its row says.
                let row: Option<(String, i64, i64)> = tx
                    .query_row(
                        "SELECT root_run_id, next_id, segments FROM trees WHERE tree_id = ?1",
                        [&**tree_id],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                    )
                    .optional()?;
                let (root_run_id, next_id, segments) = row.unwrap_or_default();
                Ok(e.insert(TreeCache {
                    root_run_id,
                    next_id: next_id.max(1) as u64,
                    segments: segments as u64,
                    ..TreeCache::default()
                }))
            }
        }
    }

    fn event(&mut self, tx: &Transaction<'_>, event: &Event) -> rusqlite::Result<()> {
        if !self.holds(tx, &event.tree_id)? {
            return Ok(());
        }
        let tree = Self::tree(self.cache, tx, &event.tree_id)?;
        let buffers = &mut *self.buffers;
        let delta = self
            .deltas
            .entry(event.tree_id.clone())
            .or_insert_with(|| TreeDelta {
                segment: buffers.take(),
                ..TreeDelta::default()
            });
        delta.last_seq = delta.last_seq.max(event.seq);
        let mut out = Records(&mut delta.segment);
        let mut reply_written = false;
        match &event.kind {
            EventKind::ModelDelta { .. } => return Ok(()),
            EventKind::Checkpointed { checkpoint } => {
                let c = checkpoint;
                let point = (c.step, c.children_spawned, c.inherited);
                write_checkpoint(&event.tree_id, tree, &mut out, &c.state, point, false)?;
                return Ok(());
            }
            // A reply served again on resume was recorded (and counted) before.
            EventKind::ModelResponded {
                step,
                usage,
                reply: Some(reply),
                ..
            } if tree.calls.is_empty() || !tree.calls.contains(&(event.run_id.clone(), *step)) => {
                reply_written = true;
                let id = message_id(tree, &mut out, reply)?;
                out.open();
                out.raw("{\"r\":");
                out.value(&*event.run_id)?;
                let _ = write!(out.0, ",\"s\":{step},\"m\":{id},\"u\":");
                out.value(usage)?;
                out.raw("}");
                delta.input_tokens += usage.input_tokens;
                delta.output_tokens += usage.output_tokens;
                delta.cost += usage.cost;
            }
            _ => {}
        }
        // A run counts once, when it starts (not again when a resumed tree
        // goes on with it), so a running or interrupted tree shows its runs.
        if matches!(event.kind, EventKind::AgentStarted { .. })
            && !tree.started.remove(&*event.run_id)
        {
            delta.agents += 1;
        }
        if let Some(state) = event.kind.final_state() {
            let inherited = event.kind.final_inherited().unwrap_or(0);
            write_checkpoint(
                &event.tree_id,
                tree,
                &mut out,
                state,
                (0, 0, inherited),
                true,
            )?;
            if *event.run_id == *tree.root_run_id {
                let error = match &event.kind {
                    EventKind::AgentFailed { error, .. } => Some(error.clone()),
                    _ => state.error_message().map(str::to_owned),
                };
                delta.end = Some((TreeStatus::from(state.status), error, event.at_ms));
            }
        }
        out.open();
        // The event's own JSON object, then its place in the tree appended
        // inside it (no copy of the body).
        journal_body(&event.kind, out.0, reply_written).map_err(json_err)?;
        if out.0.last() == Some(&b'}') {
            out.0.pop();
        }
        let _ = write!(out.0, ",\"seq\":{},\"runId\":", event.seq);
        out.value(&*event.run_id)?;
        let _ = write!(out.0, ",\"atMs\":{}}}", event.at_ms);
        if delta.segment.len() >= SEGMENT {
            let full = std::mem::replace(&mut delta.segment, self.buffers.take());
            self.closed.push((event.tree_id.clone(), full));
        }
        Ok(())
    }
}

/// The id of a message in its tree, writing it the first time it is seen.
fn message_id(
    tree: &mut TreeCache,
    out: &mut Records<'_>,
    message: &Arc<Message>,
) -> rusqlite::Result<u64> {
    let key = Arc::as_ptr(message) as usize;
    if let Some((_, id)) = tree.messages.get(&key) {
        return Ok(*id);
    }
    let id = tree.next_id;
    tree.next_id += 1;
    out.open();
    let _ = write!(out.0, "{{\"m\":{id},\"b\":");
    out.value(&**message)?;
    out.raw("}");
    tree.messages.insert(key, (message.clone(), id));
    Ok(id)
}

fn text_id(tree: &mut TreeCache, out: &mut Records<'_>, text: &Arc<str>) -> rusqlite::Result<u64> {
    let key = Arc::as_ptr(text) as *const u8 as usize;
    if let Some((_, id)) = tree.texts.get(&key) {
        return Ok(*id);
    }
    let id = tree.next_id;
    tree.next_id += 1;
    out.open();
    out.value(&json!({"p": id, "b": &**text}))?;
    tree.texts.insert(key, (text.clone(), id));
    Ok(id)
}

fn tools_id(
    tree: &mut TreeCache,
    out: &mut Records<'_>,
    tools: &ToolDefinitions,
) -> rusqlite::Result<u64> {
    let key = Arc::as_ptr(tools) as usize;
    if let Some((_, id)) = tree.tools.get(&key) {
        return Ok(*id);
    }
    let id = tree.next_id;
    tree.next_id += 1;
    out.open();
    out.value(&json!({"d": id, "b": &**tools}))?;
    tree.tools.insert(key, (tools.clone(), id));
    Ok(id)
}

/// Writes a checkpoint (or a final state) as a delta on the run's last one.
fn write_checkpoint<'s>(
    tree_id: &'s str,
    tree: &mut TreeCache,
    out: &mut Records<'_>,
    state: &'s AgentState,
    (step, children_spawned, inherited): (u32, u32, usize),
    is_final: bool,
) -> rusqlite::Result<()> {
    let history = &state.message_history;
    let run: Arc<str> = Arc::from(state.run_id.as_str());
    let (keep, chain) = match tree.last.get(&run) {
        Some((previous, chain)) if *chain < MAX_CHAIN => {
            let keep = previous
                .iter()
                .zip(history.iter())
                .take_while(|(a, b)| Arc::ptr_eq(a, b))
                .count();
            (Some(keep), chain + 1)
        }
        _ => (None, 0),
    };
    let mut appended = Vec::with_capacity(history.len() - keep.unwrap_or(0));
    for message in history.iter().skip(keep.unwrap_or(0)) {
        appended.push(message_id(tree, out, message)?);
    }
    let system_prompt = text_id(tree, out, &state.system_prompt)?;
    let tools = tools_id(tree, out, &state.tool_definitions)?;
    let short = |id: &'s str| -> &'s str {
        id.strip_prefix(tree_id)
            .and_then(|rest| rest.strip_prefix('/'))
            .unwrap_or(id)
    };
    let row = StateRow(
        (state.agent_id != state.run_id).then(|| short(&state.agent_id)),
        &state.agent_type,
        short(&state.run_id),
        state
            .parent_id
            .as_deref()
            .filter(|p| state.ancestor_run_ids.last().map(String::as_str) != Some(*p))
            .map(short),
        state.ancestor_run_ids.iter().map(|id| short(id)).collect(),
        state.child_run_ids.iter().map(|id| short(id)).collect(),
        &state.output,
        system_prompt,
        tools,
        state.context_token_count,
        state.steps_remaining,
        state.credits_used,
        state.direct_credits_used,
        state.status,
        step,
        children_spawned,
        inherited,
        state.error_kind,
    );
    out.open();
    out.raw("{\"c\":");
    out.value(&state.run_id)?;
    let _ = write!(out.0, ",\"f\":{is_final},\"k\":");
    out.value(&keep)?;
    out.raw(",\"a\":");
    out.value(&appended)?;
    out.raw("}");
    // The state row goes in as its own element right after (no copy into a Value).
    out.open();
    out.raw("{\"st\":");
    out.value(&row)?;
    out.raw("}");
    if is_final {
        tree.last.remove(&run);
    } else {
        tree.last.insert(run, (history.clone(), chain));
    }
    Ok(())
}

/// A segment as stored: its JSON array, LZ4-compressed (about 8× smaller),
/// after its length (as `lz4_flex::decompress_size_prepended` reads it).
fn pack(records: &mut Vec<u8>, out: &mut Vec<u8>) -> rusqlite::Result<usize> {
    records.push(b']');
    let size = 4 + lz4_flex::block::get_maximum_output_size(records.len());
    // Zero-filled only where it grows: the buffer is reused.
    if out.len() < size {
        out.resize(size, 0);
    }
    out[..4].copy_from_slice(&(records.len() as u32).to_le_bytes());
    let n = lz4_flex::block::compress_into(records, &mut out[4..])
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    Ok(4 + n)
}

/// Buffers reused from batch to batch (a fresh 256 KiB buffer per segment
/// cost the writer more than SQLite did).
#[derive(Default)]
pub(super) struct Buffers {
    free: Vec<Vec<u8>>,
    packed: Vec<u8>,
}

impl Buffers {
    /// A pooled buffer, or a small one that grows with what it is given: a
    /// batch touches every running tree, and a full segment's capacity for
    /// each (320 KiB × 300 trees) was most of a busy server's peak heap.
    fn take(&mut self) -> Vec<u8> {
        self.free.pop().unwrap_or_else(|| Vec::with_capacity(4096))
    }

    fn give(&mut self, mut buffer: Vec<u8>) {
        if self.free.len() < 8 {
            buffer.clear();
            self.free.push(buffer);
        }
    }
}

impl SqliteStore {
    /// `Store::write`: the batch in one transaction, tried again while
    /// another process holds the file's write lock.
    pub(super) fn write_batch(&self, batch: &[Write]) -> Result<Vec<Fenced>, Error> {
        let mut conn = self.conn()?;
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| Error::StorePoisoned("the store cache was poisoned"))?;
        let mut buffers = self
            .buffers
            .lock()
            .map_err(|_| Error::StorePoisoned("the store buffers were poisoned"))?;
        let mut claims = self
            .claims
            .lock()
            .map_err(|_| Error::StorePoisoned("the store claims were poisoned"))?;
        let attempt = |conn: &mut Connection,
                       cache: &mut HashMap<Arc<str>, TreeCache>,
                       buffers: &mut Buffers,
                       claims: &mut HashMap<Arc<str>, u64>|
         -> rusqlite::Result<Vec<Fenced>> {
            // The write lock is taken first (the busy timeout applies), not
            // upgraded from a read lock half-way (which fails at once).
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let mut b = Batch {
                cache,
                deltas: HashMap::new(),
                closed: Vec::new(),
                buffers,
                claims: &*claims,
                claimed: HashMap::new(),
                held: HashMap::new(),
                fenced: Vec::new(),
            };
            for write in batch {
                match write {
                    Write::Tree(tree) => {
                        // A new tree takes epoch 1. A resumed one was claimed
                        // (`claim`) just before: its row is taken up only if
                        // that claim still stands; a new tree landing on a
                        // stored id holds no claim, so it takes nothing over.
                        let id: Arc<str> = Arc::from(tree.tree_id.as_str());
                        let holding = b.claims.get(&id).map_or(-1, |e| *e as i64);
                        let config = match &tree.config {
                            Some(text) => {
                                let hash = config_hash(text);
                                tx.prepare_cached(
                                    "INSERT OR IGNORE INTO configs(hash, text) VALUES (?1, ?2)",
                                )?
                                .execute(params![hash, &**text])?;
                                Some(hash)
                            }
                            None => None,
                        };
                        let mut stmt = tx.prepare_cached(
                            "INSERT INTO trees(tree_id, root_run_id, agent, prompt, params, model,
                                 limits, origin, history, status, started_ms, heartbeat_ms, owner,
                                 epoch, config)
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'running', ?10, ?11, ?12, 1,
                                 ?14)
                             ON CONFLICT(tree_id) DO UPDATE SET status = 'running', error = NULL,
                                 root_run_id = excluded.root_run_id, prompt = excluded.prompt,
                                 params = excluded.params, history = excluded.history,
                                 finished_ms = NULL, heartbeat_ms = excluded.heartbeat_ms,
                                 owner = excluded.owner, resumes = resumes + 1,
                                 config = COALESCE(excluded.config, trees.config)
                             WHERE trees.epoch = ?13
                             RETURNING epoch",
                        )?;
                        let claimed: Option<i64> = stmt
                            .query_row(
                                params![
                                    tree.tree_id,
                                    tree.root_run_id,
                                    tree.agent,
                                    tree.prompt,
                                    tree.params.as_ref().map(|p| p.to_string()),
                                    tree.model,
                                    serde_json::to_string(&tree.limits).map_err(json_err)?,
                                    tree.origin,
                                    tree.history
                                        .as_ref()
                                        .map(serde_json::to_string)
                                        .transpose()
                                        .map_err(json_err)?,
                                    tree.started_ms as i64,
                                    now_ms() as i64,
                                    crate::store::owner_id(),
                                    holding,
                                    config,
                                ],
                                |r| r.get(0),
                            )
                            .optional()?;
                        b.held.remove(&id);
                        match claimed {
                            Some(epoch) => {
                                b.claimed.insert(id.clone(), epoch as u64);
                                b.held.insert(id.clone(), true);
                                // A follow-up turn has a root of its own: its
                                // end is the tree's.
                                Batch::tree(b.cache, &tx, &id)?
                                    .root_run_id
                                    .clone_from(&tree.root_run_id);
                            }
                            None => {
                                // Someone else's: fenced out, now and later.
                                b.claimed.insert(id.clone(), holding.max(0) as u64);
                                b.holds(&tx, &id)?;
                                debug_assert!(!b.held[&id]);
                            }
                        }
                    }
                    Write::Known {
                        tree_id,
                        messages,
                        calls,
                        runs,
                    } => {
                        if !b.holds(&tx, tree_id)? {
                            continue;
                        }
                        let tree = Batch::tree(b.cache, &tx, &Arc::from(tree_id.as_str()))?;
                        for (message, id) in messages {
                            let key = Arc::as_ptr(message) as usize;
                            tree.messages.insert(key, (message.clone(), *id));
                        }
                        for (run, step) in calls {
                            tree.calls.insert((Arc::from(run.as_str()), *step));
                        }
                        tree.started
                            .extend(runs.iter().map(|r| Arc::from(r.as_str())));
                    }
                    Write::Event(event) => b.event(&tx, event)?,
                    Write::Heartbeat(trees) => {
                        let mut stmt = tx.prepare_cached(
                            "UPDATE trees SET heartbeat_ms = ?2
                             WHERE tree_id = ?1 AND owner != '-:released'",
                        )?;
                        for tree in trees {
                            if b.holds(&tx, tree)? {
                                stmt.execute(params![tree, now_ms() as i64])?;
                            }
                        }
                    }
                    Write::Release(trees) => {
                        // No owner and no heartbeat: interrupted, whoever looks.
                        let mut stmt = tx.prepare_cached(
                            "UPDATE trees SET owner = '-:released', heartbeat_ms = 0
                             WHERE tree_id = ?1 AND status = 'running' AND owner = ?2",
                        )?;
                        for tree in trees {
                            if b.holds(&tx, tree)? {
                                stmt.execute(params![tree, crate::store::owner_id()])?;
                            }
                        }
                    }
                }
            }
            let mut segments = std::mem::take(&mut b.closed);
            for (tree, delta) in &mut b.deltas {
                let segment = std::mem::take(&mut delta.segment);
                if segment.is_empty() {
                    b.buffers.give(segment);
                } else {
                    segments.push((tree.clone(), segment));
                }
            }
            {
                let mut stmt = tx
                    .prepare_cached("INSERT INTO segments(tree_id, n, body) VALUES (?1, ?2, ?3)")?;
                for (tree, mut records) in segments {
                    let cache = Batch::tree(b.cache, &tx, &tree)?;
                    cache.segments += 1;
                    let mut packed = std::mem::take(&mut b.buffers.packed);
                    let len = pack(&mut records, &mut packed)?;
                    stmt.execute(params![&*tree, cache.segments as i64, &packed[..len]])?;
                    b.buffers.packed = packed;
                    b.buffers.give(records);
                }
            }
            {
                let mut stmt = tx.prepare_cached(
                    // A tree released in this batch (or before) keeps no heartbeat:
                    // it stays interrupted for the next process to resume at once.
                    "UPDATE trees SET last_seq = max(last_seq, ?2),
                         heartbeat_ms = CASE WHEN owner = '-:released' THEN 0 ELSE ?3 END,
                         next_id = ?4, segments = ?5, agents = agents + ?6,
                         input_tokens = input_tokens + ?7, output_tokens = output_tokens + ?8,
                         cost = cost + ?9
                     WHERE tree_id = ?1",
                )?;
                let mut end = tx.prepare_cached(
                    "UPDATE trees SET status = ?2, error = ?3, finished_ms = ?4 WHERE tree_id = ?1",
                )?;
                for (tree, delta) in &b.deltas {
                    let cache = Batch::tree(b.cache, &tx, tree)?;
                    stmt.execute(params![
                        &**tree,
                        delta.last_seq as i64,
                        now_ms() as i64,
                        cache.next_id as i64,
                        cache.segments as i64,
                        delta.agents as i64,
                        delta.input_tokens as i64,
                        delta.output_tokens as i64,
                        delta.cost,
                    ])?;
                    if let Some((status, error, at)) = &delta.end {
                        end.execute(params![&**tree, status, error, *at as i64])?;
                    }
                }
            }
            for tree in b.deltas.keys() {
                if let Some(cache) = b.cache.get_mut(tree) {
                    cache.sweep();
                }
            }
            // A finished tree needs no cache any more.
            let ended: Vec<Arc<str>> = b
                .deltas
                .iter()
                .filter(|(_, d)| d.end.is_some())
                .map(|(t, _)| t.clone())
                .collect();
            tx.commit()?;
            // Claims made here hold from now on; a fenced tree keeps the
            // epoch it had (so nothing more of it is written), and needs no
            // cache; an ended tree needs neither.
            let Batch {
                cache,
                claimed,
                fenced,
                ..
            } = b;
            claims.extend(claimed);
            for f in &fenced {
                cache.remove(f.tree_id.as_str());
            }
            for tree in ended {
                cache.remove(&tree);
                claims.remove(&tree);
            }
            Ok(fenced)
        };
        // Another process holding the lock beyond the busy timeout is not a
        // broken store: try again a few times before failing the trees.
        let mut tries = 0;
        loop {
            match attempt(&mut conn, &mut cache, &mut buffers, &mut claims) {
                Ok(fenced) => return Ok(fenced),
                Err(e) => {
                    let busy = is_busy(&e);
                    // What the cache says was written was rolled back.
                    cache.clear();
                    tries += 1;
                    if !busy || tries >= BUSY_RETRIES {
                        return Err(Error::StoreWrite {
                            path: self.path.clone(),
                            source: Box::new(e),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(100 * tries));
                }
            }
        }
    }
}

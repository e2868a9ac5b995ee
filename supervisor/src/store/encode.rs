//! The write path's backend-neutral half: the writer's cache of what each
//! tree has been given (to write only what is new), the segment encoding (an
//! LZ4-compressed JSON array of records), and the fencing decisions of a
//! batch. A backend drives an `Encoder` through one batch inside its own
//! transaction: it answers the encoder's row lookups (`Rows`), carries out
//! the tree records, heartbeats and releases, and writes the segments and
//! row updates the encoder hands back.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::sync::{Arc, Weak};

use arbor_actors::state::ToolDefinitions;
use arbor_actors::{AgentState, Event, EventKind, History, Message, RunId, TreeId};
use serde::Serialize;

use crate::store::journal::journal_body;
use crate::store::state_row::StateRow;
use crate::store::{Fenced, TreeStatus};

/// What encoding a batch can fail on.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EncodeError {
    /// A value could not be written as JSON.
    #[error("cannot encode a record: {0}")]
    Json(#[from] serde_json::Error),
    /// A segment could not be compressed.
    #[error("cannot compress a segment: {0}")]
    Compress(#[from] lz4_flex::block::CompressError),
}

/// What the encoder asks of the backend's transaction about a tree's row.
pub(crate) trait Rows {
    /// The backend's error; encoding errors become one.
    type Error: From<EncodeError>;
    /// The tree's claim: its epoch and owner; `None` if there is no row.
    fn claim_of(&mut self, tree_id: &str) -> Result<Option<(u64, String)>, Self::Error>;
    /// Where the tree's log goes on from: root run id, next record id,
    /// segments written; `None` if there is no row.
    fn log_of(&mut self, tree_id: &str) -> Result<Option<(String, u64, u64)>, Self::Error>;
    /// The highest `seq` its row says was written (0 without a row). A
    /// backend whose commit can go unanswered (Postgres, over a connection
    /// that was cut) answers it, so a batch tried again after its commit did
    /// go through writes none of its events twice.
    fn last_seq_of(&mut self, _tree_id: &str) -> Result<u64, Self::Error> {
        Ok(0)
    }
}

/// What a batch adds to one tree's row.
#[derive(Debug)]
pub(crate) struct TreeUpdate {
    /// The tree.
    pub(crate) tree_id: Arc<str>,
    /// The epoch this process holds it with; `None` for a tree written
    /// without a claim (through the port directly).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) epoch: Option<u64>,
    /// The highest `seq` written.
    pub(crate) last_seq: u64,
    /// The next record id of its log.
    pub(crate) next_id: u64,
    /// Segments its log has now.
    pub(crate) segments: u64,
    /// Runs started.
    pub(crate) agents: u64,
    /// Input tokens of the model calls recorded.
    pub(crate) input_tokens: u64,
    /// Output tokens of the model calls recorded.
    pub(crate) output_tokens: u64,
    /// Credits of the model calls recorded.
    pub(crate) cost: f64,
    /// Its root ended: the status, error and when.
    pub(crate) end: Option<(TreeStatus, Option<String>, u64)>,
}

/// The state a backend keeps between batches for the encoder: the caches of
/// its trees, the reused buffers, and the epochs it claimed trees with
/// (kept apart from the cache, which a failed batch clears and reloads from
/// the row, so a later claim by another process is never mistaken for this
/// one's).
#[derive(Default)]
pub(crate) struct WriterState {
    pub(crate) cache: HashMap<Arc<str>, TreeCache>,
    pub(crate) buffers: Buffers,
    pub(crate) claims: HashMap<Arc<str>, u64>,
}
/// One batch being encoded, inside a backend's transaction.
pub(crate) struct Encoder<'a> {
    cache: &'a mut HashMap<Arc<str>, TreeCache>,
    deltas: HashMap<Arc<str>, TreeDelta>,
    /// Segments closed during the batch: (tree, packed JSON array, its last
    /// `seq`).
    closed: Vec<(Arc<str>, Vec<u8>, u64)>,
    buffers: &'a mut Buffers,
    /// The epochs this process holds (before this batch); 0 for a tree it
    /// wrote without holding a claim (it is then fenced out at once).
    claims: &'a HashMap<Arc<str>, u64>,
    /// Claims made by this batch, held once it commits.
    claimed: HashMap<Arc<str>, u64>,
    /// Trees looked at in this batch: whether this process still holds them.
    held: HashMap<Arc<str>, bool>,
    /// Trees another process claimed since this one did.
    fenced: Vec<Fenced>,
}

/// What a committed batch leaves for the writer's state to take up.
pub(crate) struct Encoded {
    claimed: HashMap<Arc<str>, u64>,
    fenced: Vec<Fenced>,
    ended: Vec<Arc<str>>,
}

impl<'a> Encoder<'a> {
    /// A batch over the writer's state.
    pub(crate) fn new(state: &'a mut WriterState) -> Self {
        Encoder {
            cache: &mut state.cache,
            deltas: HashMap::new(),
            closed: Vec::new(),
            buffers: &mut state.buffers,
            claims: &state.claims,
            claimed: HashMap::new(),
            held: HashMap::new(),
            fenced: Vec::new(),
        }
    }

    /// The epoch this process holds `tree_id` with (a claim of this batch
    /// first); `None` if it holds no claim of it.
    pub(crate) fn epoch(&self, tree_id: &str) -> Option<u64> {
        self.claimed
            .get(tree_id)
            .or_else(|| self.claims.get(tree_id))
            .copied()
    }

    /// The epoch a `Tree` record of `tree_id` may take the row over from:
    /// the claim this process holds, or -1 (none: a new tree landing on a
    /// stored id takes nothing over).
    pub(crate) fn holding(&self, tree_id: &str) -> i64 {
        self.claims.get(tree_id).map_or(-1, |e| *e as i64)
    }

    /// Whether this process may still write `tree_id`: the row keeps the
    /// epoch it claimed the tree with. Looked up once per tree per batch (the
    /// batch holds the row or the write lock, so it cannot change
    /// meanwhile). A tree this store never claimed (written through the port
    /// directly) is not fenced.
    pub(crate) fn holds<R: Rows>(
        &mut self,
        rows: &mut R,
        tree_id: &TreeId,
    ) -> Result<bool, R::Error> {
        if let Some(held) = self.held.get(tree_id.as_str()) {
            return Ok(*held);
        }
        let tree: Arc<str> = tree_id.as_arc().clone();
        let Some(epoch) = self.epoch(tree_id) else {
            self.held.insert(tree, true);
            return Ok(true);
        };
        let held = match rows.claim_of(tree_id)? {
            Some((current, _)) if current == epoch && epoch != 0 => true,
            row => {
                let (current, owner) = row.unwrap_or((0, String::new()));
                self.fenced.push(Fenced {
                    tree_id: tree_id.clone(),
                    epoch,
                    current,
                    owner,
                });
                false
            }
        };
        self.held.insert(tree, held);
        Ok(held)
    }

    /// A `Tree` record was written (`claimed`: the epoch its row has now) or
    /// refused (`None`: the row is someone else's; fenced out, now and later).
    pub(crate) fn tree_written<R: Rows>(
        &mut self,
        rows: &mut R,
        tree_id: &TreeId,
        root_run_id: &str,
        claimed: Option<u64>,
    ) -> Result<(), R::Error> {
        let id: Arc<str> = tree_id.as_arc().clone();
        self.held.remove(&id);
        match claimed {
            Some(epoch) => {
                self.claimed.insert(id.clone(), epoch);
                self.held.insert(id.clone(), true);
                // A follow-up turn has a root of its own: its end is the tree's.
                root_run_id.clone_into(&mut Self::tree(self.cache, rows, &id)?.root_run_id);
            }
            None => {
                let holding = self.holding(tree_id);
                self.claimed.insert(id.clone(), holding.max(0) as u64);
                self.holds(rows, tree_id)?;
                debug_assert!(!self.held[&id]);
            }
        }
        Ok(())
    }

    /// What a resumed tree's store already holds (`Write::Known`).
    pub(crate) fn known<R: Rows>(
        &mut self,
        rows: &mut R,
        tree_id: &TreeId,
        messages: &[(Arc<Message>, u64)],
        calls: &[(String, u32)],
        runs: &[String],
    ) -> Result<(), R::Error> {
        if !self.holds(rows, tree_id)? {
            return Ok(());
        }
        let tree = Self::tree(self.cache, rows, tree_id.as_arc())?;
        for (message, id) in messages {
            let key = Arc::as_ptr(message) as usize;
            tree.messages.insert(key, (Arc::downgrade(message), *id));
        }
        // A stored id that is no run id matches no event.
        for (run, step) in calls {
            if let Ok(run) = run.parse::<RunId>() {
                tree.calls.insert((run, *step));
            }
        }
        tree.started
            .extend(runs.iter().filter_map(|r| r.parse::<RunId>().ok()));
        Ok(())
    }

    fn tree<'t, R: Rows>(
        cache: &'t mut HashMap<Arc<str>, TreeCache>,
        rows: &mut R,
        tree_id: &Arc<str>,
    ) -> Result<&'t mut TreeCache, R::Error> {
        match cache.entry(tree_id.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => {
                // A tree this process has not seen (it started elsewhere): go
                // on from what its row says.
                let (root_run_id, next_id, segments) = rows.log_of(tree_id)?.unwrap_or_default();
                let written_seq = rows.last_seq_of(tree_id)?;
                Ok(e.insert(TreeCache {
                    root_run_id,
                    next_id: next_id.max(1),
                    segments,
                    written_seq,
                    ..TreeCache::default()
                }))
            }
        }
    }

    /// An event of a tree, appended to its segment (if this process holds it).
    pub(crate) fn event<R: Rows>(&mut self, rows: &mut R, event: &Event) -> Result<(), R::Error> {
        if !self.holds(rows, &event.tree_id)? {
            return Ok(());
        }
        let tree = Self::tree(self.cache, rows, event.tree_id.as_arc())?;
        // Already stored: a batch tried again after a commit that went
        // through unanswered (see `Rows::last_seq_of`).
        if event.seq <= tree.written_seq {
            return Ok(());
        }
        let buffers = &mut *self.buffers;
        let delta = self
            .deltas
            .entry(event.tree_id.as_arc().clone())
            .or_insert_with(|| TreeDelta {
                segment: buffers.take(),
                ..TreeDelta::default()
            });
        delta.last_seq = delta.last_seq.max(event.seq);
        delta.segment_seq = delta.segment_seq.max(event.seq);
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
            // A reply served again on resume was recorded (and counted) before
            // (its event says so, and the writer knows the calls it has).
            EventKind::ModelResponded {
                step,
                usage,
                reply: Some(reply),
                from_record: false,
                ..
            } if tree.calls.is_empty() || !tree.calls.contains(&(event.run_id.clone(), *step)) => {
                reply_written = true;
                let id = message_id(tree, &mut out, reply)?;
                out.open();
                out.raw("{\"r\":");
                out.value(&event.run_id)?;
                let _ = write!(out.0, ",\"s\":{step},\"m\":{id},\"u\":");
                out.value(usage)?;
                out.raw("}");
                delta.input_tokens += usage.input_tokens;
                delta.output_tokens += usage.output_tokens;
                delta.cost += usage.cost;
            }
            // A compaction's summary call: no step's reply, but billed.
            EventKind::HistoryCompacted { usage, .. } => {
                delta.input_tokens += usage.input_tokens;
                delta.output_tokens += usage.output_tokens;
                delta.cost += usage.cost;
            }
            // A reply billed and not acted on (cut at the output limit):
            // no reply is recorded; its usage is its event's, and counts.
            EventKind::ModelResponded {
                usage,
                refused: true,
                ..
            } => {
                delta.input_tokens += usage.input_tokens;
                delta.output_tokens += usage.output_tokens;
                delta.cost += usage.cost;
            }
            _ => {}
        }
        // A run counts once, when it starts (not again when a resumed tree
        // goes on with it), so a running or interrupted tree shows its runs.
        if matches!(event.kind, EventKind::AgentStarted { .. })
            && !tree.started.remove(&event.run_id)
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
            if event.run_id == tree.root_run_id {
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
        journal_body(&event.kind, out.0, reply_written).map_err(EncodeError::from)?;
        if out.0.last() == Some(&b'}') {
            out.0.pop();
        }
        let _ = write!(out.0, ",\"seq\":{},\"runId\":", event.seq);
        out.value(&event.run_id)?;
        let _ = write!(out.0, ",\"atMs\":{}}}", event.at_ms);
        if delta.segment.len() >= SEGMENT {
            // Packed at once, and its buffer goes on with the next segment:
            // a batch of many full segments kept each one's JSON (and grew a
            // fresh buffer to 256 KiB for every next one, copying it each
            // time it doubled).
            let packed = &mut self.buffers.packed;
            let len = pack(&mut delta.segment, packed)?;
            let seq = std::mem::take(&mut delta.segment_seq);
            self.closed
                .push((event.tree_id.as_arc().clone(), packed[..len].to_vec(), seq));
            delta.segment.clear();
        }
        Ok(())
    }

    /// The batch's segments, numbered on from each tree's log and packed, in
    /// order: `put(tree, n, body, last_seq)` writes one (`last_seq`: the
    /// highest `seq` of its events, 0 if it has none; a reader of the
    /// journal past a `seq` skips the segments at or below it).
    pub(crate) fn segments<R: Rows>(
        &mut self,
        rows: &mut R,
        mut put: impl FnMut(&Arc<str>, u64, &[u8], u64) -> Result<(), R::Error>,
    ) -> Result<(), R::Error> {
        // A tree's closed segments come before the one it is filling.
        for (tree, packed, seq) in std::mem::take(&mut self.closed) {
            let cache = Self::tree(self.cache, rows, &tree)?;
            cache.segments += 1;
            put(&tree, cache.segments, &packed, seq)?;
        }
        for (tree, delta) in &mut self.deltas {
            let mut records = std::mem::take(&mut delta.segment);
            let seq = std::mem::take(&mut delta.segment_seq);
            if records.is_empty() {
                self.buffers.give(records);
                continue;
            }
            let cache = Self::tree(self.cache, rows, tree)?;
            cache.segments += 1;
            let mut packed = std::mem::take(&mut self.buffers.packed);
            let len = pack(&mut records, &mut packed)?;
            let written = put(tree, cache.segments, &packed[..len], seq);
            self.buffers.packed = packed;
            self.buffers.give(records);
            written?;
        }
        Ok(())
    }

    /// What the batch adds to each tree's row (after `segments`).
    pub(crate) fn updates<R: Rows>(&mut self, rows: &mut R) -> Result<Vec<TreeUpdate>, R::Error> {
        let mut out = Vec::with_capacity(self.deltas.len());
        for (tree, delta) in &self.deltas {
            let epoch = self.epoch(tree);
            let cache = Self::tree(self.cache, rows, tree)?;
            out.push(TreeUpdate {
                tree_id: tree.clone(),
                epoch,
                last_seq: delta.last_seq,
                next_id: cache.next_id,
                segments: cache.segments,
                agents: delta.agents,
                input_tokens: delta.input_tokens,
                output_tokens: delta.output_tokens,
                cost: delta.cost,
                end: delta.end.clone(),
            });
        }
        for tree in self.deltas.keys() {
            if let Some(cache) = self.cache.get_mut(tree) {
                cache.sweep();
            }
        }
        Ok(out)
    }

    /// Trees this batch wrote events of, with the last `seq` written (what a
    /// wake-up names).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn last_seqs(&self) -> impl Iterator<Item = (&Arc<str>, u64)> {
        self.deltas.iter().map(|(t, d)| (t, d.last_seq))
    }

    /// The batch as it ends, before its transaction commits.
    pub(crate) fn finish(self) -> Encoded {
        Encoded {
            ended: self
                .deltas
                .iter()
                .filter(|(_, d)| d.end.is_some())
                .map(|(t, _)| t.clone())
                .collect(),
            claimed: self.claimed,
            fenced: self.fenced,
        }
    }
}

impl WriterState {
    /// A batch committed: claims made in it hold from now on; a fenced tree
    /// keeps the epoch it had (so nothing more of it is written) and needs no
    /// cache; an ended tree needs neither. Returns the trees fenced out.
    pub(crate) fn committed(&mut self, done: Encoded) -> Vec<Fenced> {
        self.claims.extend(done.claimed);
        for f in &done.fenced {
            self.cache.remove(f.tree_id.as_str());
        }
        let mut retired = Vec::new();
        for tree in done.ended {
            retired.extend(self.cache.remove(&tree));
            self.claims.remove(&tree);
        }
        retire(retired);
        done.fenced
    }
}

/// Messages an ended tree's cache may hold and still be freed on the writer's
/// thread.
const FREE_HERE: usize = 4096;

/// Frees the caches of ended trees: a big one (an entry and a message's
/// allocation for every message of the tree, 1.1 million for the load test's
/// 11,111 agents) on a thread of its own, not on the writer's, which a tree's
/// end (and a flush) waits for.
fn retire(caches: Vec<TreeCache>) {
    if caches.iter().map(|c| c.messages.len()).sum::<usize>() <= FREE_HERE {
        return;
    }
    // Should no thread start, the closure (and the caches) is dropped here.
    let _ = std::thread::Builder::new()
        .name("arbor-store-free".into())
        .spawn(move || drop(caches));
}

/// The key of a config text in `configs`.
pub(crate) fn config_hash(text: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A checkpoint chain longer than this is cut with a full list of message ids.
const MAX_CHAIN: u32 = 256;

/// Bytes of JSON after which a segment is closed and a new one begun.
pub(crate) const SEGMENT: usize = 256 * 1024;

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
pub(crate) struct TreeCache {
    root_run_id: String,
    next_id: u64,
    segments: u64,
    /// The highest `seq` stored when this cache was loaded from the row:
    /// events up to it are not written again.
    written_seq: u64,
    /// Ids of shared values, by address; the value (for messages, its
    /// allocation: a weak reference, so a message nothing else holds is freed
    /// where it was dropped, not kept and then freed on this thread) is kept
    /// alive so the address cannot be reused while it is in the map.
    messages: ByAddress<(Weak<Message>, u64)>,
    texts: ByAddress<(Arc<str>, u64)>,
    tools: ByAddress<(ToolDefinitions, u64)>,
    /// Per live run: the history of its last checkpoint and the chain length.
    last: HashMap<RunId, (History, u32)>,
    /// Model calls recorded before this process resumed the tree: served
    /// again from the record, they are not written (or counted) twice. Empty
    /// for a tree started here (a call is never answered twice in one life).
    calls: HashSet<(RunId, u32)>,
    /// Runs that started before this process resumed the tree: starting
    /// again, they are not counted again (each leaves the set as it does).
    started: HashSet<RunId>,
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
        self.messages.retain(|_, (m, _)| m.strong_count() > 0);
        self.texts.retain(|_, (t, _)| Arc::strong_count(t) > 1);
        self.tools.retain(|_, (t, _)| Arc::strong_count(t) > 1);
        self.swept = self.messages.len();
    }
}

/// What a batch adds to a tree's row.
#[derive(Default)]
struct TreeDelta {
    last_seq: u64,
    /// The highest `seq` in `segment`.
    segment_seq: u64,
    agents: u64,
    input_tokens: u64,
    output_tokens: u64,
    cost: f64,
    end: Option<(TreeStatus, Option<String>, u64)>,
    segment: Vec<u8>,
}

fn json_err(e: serde_json::Error) -> EncodeError {
    EncodeError::Json(e)
}

/// One segment being filled: appends records as JSON array elements.
struct Records<'a>(&'a mut Vec<u8>);

impl Records<'_> {
    fn open(&mut self) {
        self.0.push(if self.0.is_empty() { b'[' } else { b',' });
    }

    fn value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        serde_json::to_writer(&mut *self.0, value).map_err(json_err)
    }

    fn raw(&mut self, text: &str) {
        self.0.extend_from_slice(text.as_bytes());
    }
}

/// The id of a message in its tree, writing it the first time it is seen.
fn message_id(
    tree: &mut TreeCache,
    out: &mut Records<'_>,
    message: &Arc<Message>,
) -> Result<u64, EncodeError> {
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
    tree.messages.insert(key, (Arc::downgrade(message), id));
    Ok(id)
}

fn text_id(
    tree: &mut TreeCache,
    out: &mut Records<'_>,
    text: &Arc<str>,
) -> Result<u64, EncodeError> {
    let key = Arc::as_ptr(text) as *const u8 as usize;
    if let Some((_, id)) = tree.texts.get(&key) {
        return Ok(*id);
    }
    let id = tree.next_id;
    tree.next_id += 1;
    out.open();
    // As `{"p": id, "b": text}` was written through a `Value` (a copy of
    // the text), without the copy.
    let _ = write!(out.0, "{{\"p\":{id},\"b\":");
    out.value(&**text)?;
    out.raw("}");
    tree.texts.insert(key, (text.clone(), id));
    Ok(id)
}

fn tools_id(
    tree: &mut TreeCache,
    out: &mut Records<'_>,
    tools: &ToolDefinitions,
) -> Result<u64, EncodeError> {
    let key = Arc::as_ptr(tools) as usize;
    if let Some((_, id)) = tree.tools.get(&key) {
        return Ok(*id);
    }
    let id = tree.next_id;
    tree.next_id += 1;
    out.open();
    let _ = write!(out.0, "{{\"d\":{id},\"b\":");
    out.value(&**tools)?;
    out.raw("}");
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
) -> Result<(), EncodeError> {
    let history = &state.message_history;
    let run = &state.run_id;
    let common = |previous: &History| {
        previous
            .iter()
            .zip(history.iter())
            .take_while(|(a, b)| Arc::ptr_eq(a, b))
            .count()
    };
    // A run's first record starts from its parent's last checkpoint when
    // their histories begin alike (a child inherits its parent's messages):
    // the child then lists only what it added, not the ~100 inherited ids.
    let parent = state.parent_run_id();
    let (keep, chain, from) = match tree.last.get(run) {
        Some((previous, chain)) if *chain < MAX_CHAIN => (Some(common(previous)), chain + 1, None),
        Some(_) => (None, 0, None),
        None => match parent.and_then(|p| tree.last.get(p).map(|last| (p, last))) {
            Some((p, (previous, chain))) if *chain < MAX_CHAIN => match common(previous) {
                0 => (None, 0, None),
                keep => (Some(keep), chain + 1, Some(p)),
            },
            _ => (None, 0, None),
        },
    };
    let mut appended = Vec::with_capacity(history.len() - keep.unwrap_or(0));
    for message in history.iter().skip(keep.unwrap_or(0)) {
        appended.push(message_id(tree, out, message)?);
    }
    let system_prompt = text_id(tree, out, &state.system_prompt)?;
    let tools = tools_id(tree, out, &state.tool_definitions)?;
    let row = StateRow::of(
        tree_id,
        state,
        (system_prompt, tools),
        (step, children_spawned, inherited),
    );
    out.open();
    out.raw("{\"c\":");
    out.value(&state.run_id)?;
    if let Some(parent) = from {
        out.raw(",\"from\":");
        out.value(parent)?;
    }
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
        tree.last.remove(run);
    } else {
        tree.last.insert(run.clone(), (history.clone(), chain));
    }
    Ok(())
}

/// A segment as stored: its JSON array, LZ4-compressed (about 8× smaller),
/// after its length (as `lz4_flex::decompress_size_prepended` reads it).
pub(crate) fn pack(records: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<usize, EncodeError> {
    records.push(b']');
    let size = 4 + lz4_flex::block::get_maximum_output_size(records.len());
    // Zero-filled only where it grows: the buffer is reused.
    if out.len() < size {
        out.resize(size, 0);
    }
    out[..4].copy_from_slice(&(records.len() as u32).to_le_bytes());
    let n =
        lz4_flex::block::compress_into(records, &mut out[4..]).map_err(EncodeError::Compress)?;
    Ok(4 + n)
}

/// Buffers reused from batch to batch (a fresh 256 KiB buffer per segment
/// cost the writer more than SQLite did).
#[derive(Default)]
pub(crate) struct Buffers {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;
    use std::sync::Arc;

    use arbor_actors::state::{ToolDefinition, ToolDefinitions};
    use serde_json::json;

    use super::{Records, TreeCache, text_id, tools_id};

    /// A system prompt's and tool definitions' records, written without a
    /// copy through a `Value`, are byte for byte what they were with it (a
    /// stored segment reads the same), and each is written once.
    #[test]
    fn a_text_or_tools_record_is_the_bytes_it_was_through_a_value() {
        let text: Arc<str> = Arc::from("be \"brief\"\n\u{e9}");
        let mut tools = BTreeMap::new();
        for name in ["zeta", "alpha"] {
            let schema = json!({"type": "object", "properties": {"q": {"type": "string"}}});
            let tool = ToolDefinition {
                description: format!("{name} \"tool\""),
                input_schema: schema,
            };
            tools.insert(name.to_owned(), tool);
        }
        let tools: ToolDefinitions = Arc::new(tools);
        let (mut tree, mut out) = (TreeCache::default(), Vec::new());
        let mut records = Records(&mut out);
        assert_eq!(text_id(&mut tree, &mut records, &text).unwrap(), 0);
        assert_eq!(tools_id(&mut tree, &mut records, &tools).unwrap(), 1);
        assert_eq!(text_id(&mut tree, &mut records, &text).unwrap(), 0);
        assert_eq!(tools_id(&mut tree, &mut records, &tools).unwrap(), 1);
        let through_values = format!(
            "[{},{}",
            json!({"p": 0, "b": &*text}),
            json!({"d": 1, "b": &*tools})
        );
        assert_eq!(String::from_utf8(out).unwrap(), through_values);
    }
}

//! The embedded store: one SQLite file in WAL mode.
//!
//! Messages (and system prompts and tool definitions) are stored once: history
//! is shared (`Arc`) between a run's checkpoints and with its children, so a
//! message is known by its address while the writer holds it, and written the
//! first time it is seen. A checkpoint refers to messages by id, as the
//! previous checkpoint of its run plus the messages appended since, so a long
//! history is never rewritten whole.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arbor_actors::state::ToolDefinitions;
use arbor_actors::{
    AgentState, AgentStatus, Checkpoint, Event, EventKind, History, Message, Usage,
};
use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction, params};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{
    GcReport, RunNode, STALE_AFTER_MS, Store, StoredRun, TreeFilter, TreeRecord, TreeSummary, Write,
};
use crate::error::Error;
use crate::recovery::{RecordedReply, Recovery, Spent};
use crate::tree::now_ms;

/// "ARBR": tells an Arbor store from any other SQLite file.
const APPLICATION_ID: i64 = 0x4152_4252;

/// Migrations, in order; `PRAGMA user_version` is how many have been applied.
const MIGRATIONS: &[&str] = &[r#"
CREATE TABLE trees (
    tree_id      TEXT PRIMARY KEY,
    root_run_id  TEXT NOT NULL,
    agent        TEXT NOT NULL,
    prompt       TEXT NOT NULL,
    params       TEXT,
    model        TEXT,
    limits       TEXT NOT NULL,
    origin       TEXT,
    status       TEXT NOT NULL,
    error        TEXT,
    started_ms   INTEGER NOT NULL,
    finished_ms  INTEGER,
    heartbeat_ms INTEGER NOT NULL,
    owner        TEXT NOT NULL,
    last_seq     INTEGER NOT NULL DEFAULT 0,
    resumes      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX trees_started ON trees(started_ms);
CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    tree_id          TEXT NOT NULL,
    agent_id         TEXT NOT NULL,
    parent_run_id    TEXT,
    agent_type       TEXT NOT NULL,
    depth            INTEGER NOT NULL,
    inherited        INTEGER NOT NULL,
    status           TEXT NOT NULL,
    error            TEXT,
    started_ms       INTEGER NOT NULL,
    finished_ms      INTEGER,
    final_checkpoint INTEGER
);
CREATE INDEX runs_tree ON runs(tree_id);
CREATE TABLE blobs (
    id   INTEGER PRIMARY KEY,
    body BLOB NOT NULL
);
CREATE TABLE checkpoints (
    id       INTEGER PRIMARY KEY,
    run_id   TEXT NOT NULL,
    step     INTEGER NOT NULL,
    final    INTEGER NOT NULL,
    base     INTEGER,
    keep     INTEGER NOT NULL,
    appended BLOB NOT NULL,
    state    TEXT NOT NULL,
    at_ms    INTEGER NOT NULL
);
CREATE INDEX checkpoints_run ON checkpoints(run_id, id);
CREATE TABLE model_calls (
    run_id        TEXT NOT NULL,
    step          INTEGER NOT NULL,
    reply         INTEGER NOT NULL,
    input_tokens  INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cache_read    INTEGER NOT NULL,
    cache_write   INTEGER NOT NULL,
    cost          REAL NOT NULL,
    at_ms         INTEGER NOT NULL,
    PRIMARY KEY (run_id, step)
) WITHOUT ROWID;
CREATE TABLE journal (
    tree_id   TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq  INTEGER NOT NULL,
    events    BLOB NOT NULL,
    PRIMARY KEY (tree_id, first_seq)
) WITHOUT ROWID;
"#];

/// How long a write waits for another process holding the file's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A checkpoint chain longer than this is cut with a full list of message ids.
const MAX_CHAIN: u32 = 256;

/// What the writer remembers between batches to write only what is new.
#[derive(Default)]
struct Cache {
    /// Per live run: its last checkpoint, the history it held, the chain length.
    last: HashMap<String, (i64, History, u32)>,
    /// Blob ids of shared values, by address; the value is kept alive so the
    /// address cannot be reused while it is in the map.
    messages: HashMap<usize, (Arc<Message>, i64)>,
    texts: HashMap<usize, (Arc<str>, i64)>,
    tools: HashMap<usize, (ToolDefinitions, i64)>,
}

impl Cache {
    fn trim(&mut self) {
        if self.messages.len() > 500_000 {
            self.messages.clear();
        }
        if self.texts.len() > 10_000 {
            self.texts.clear();
        }
        if self.tools.len() > 10_000 {
            self.tools.clear();
        }
    }
}

pub struct SqliteStore {
    path: PathBuf,
    conn: Mutex<Connection>,
    cache: Mutex<Cache>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> Error + '_ {
    move |e| Error::Store(format!("{}: {e}", path.display()))
}

impl SqliteStore {
    /// Opens the store at `path`, creating it (and its migrations) if needed.
    pub fn open(path: &Path) -> Result<Self, Error> {
        Self::open_with(path, true)
    }

    /// Opens an existing store; fails if there is none at `path`.
    pub fn open_existing(path: &Path) -> Result<Self, Error> {
        if !path.is_file() {
            return Err(Error::StoreOpen {
                path: path.display().to_string(),
                reason: "no store there (run a tree first, or pass --store)".into(),
            });
        }
        Self::open_with(path, false)
    }

    fn open_with(path: &Path, create: bool) -> Result<Self, Error> {
        // Another process opening (or migrating) the same file at this moment
        // can make setup fail with "locked" before the busy timeout applies.
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        loop {
            match Self::try_open(path, create) {
                Err(Error::StoreOpen { reason, .. })
                    if (reason.contains("locked") || reason.contains("busy"))
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    fn try_open(path: &Path, create: bool) -> Result<Self, Error> {
        let open_err = |reason: String| Error::StoreOpen {
            path: path.display().to_string(),
            reason,
        };
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
        let conn = Connection::open_with_flags(path, flags).map_err(|e| open_err(e.to_string()))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| open_err(e.to_string()))?;
        // Reading the header is the first thing that touches the file: a file
        // that is not SQLite fails here, before anything is written.
        let not_arbor = || Error::NotAStore {
            path: path.display().to_string(),
        };
        let app: i64 = conn
            .pragma_query_value(None, "application_id", |r| r.get(0))
            .map_err(|_| not_arbor())?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|_| not_arbor())?;
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(|_| not_arbor())?;
        if app != APPLICATION_ID && (app != 0 || tables > 0) {
            return Err(not_arbor());
        }
        let known = MIGRATIONS.len() as i64;
        if version > known {
            return Err(Error::NewerStore {
                path: path.display().to_string(),
                found: version,
                known,
            });
        }
        // Before the first table: 16 KiB pages measured faster than 4 KiB for
        // the writer's batches (BENCHMARKS.md); an existing file keeps its own.
        if tables == 0 {
            conn.pragma_update(None, "page_size", 16384)
                .map_err(|e| open_err(e.to_string()))?;
        }
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| open_err(e.to_string()))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(|e| open_err(e.to_string()))?;
        conn.pragma_update(None, "foreign_keys", "OFF")
            .map_err(|e| open_err(e.to_string()))?;
        let mut conn = conn;
        if version < known {
            // Under the write lock, and looked at again: another process may
            // have migrated the file since it was read above.
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(|e| open_err(e.to_string()))?;
            let version: i64 = tx
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .map_err(|e| open_err(e.to_string()))?;
            if version > known {
                return Err(Error::NewerStore {
                    path: path.display().to_string(),
                    found: version,
                    known,
                });
            }
            if version < known {
                for migration in &MIGRATIONS[version.max(0) as usize..] {
                    tx.execute_batch(migration)
                        .map_err(|e| open_err(format!("migration failed: {e}")))?;
                }
                tx.pragma_update(None, "application_id", APPLICATION_ID)
                    .map_err(|e| open_err(e.to_string()))?;
                tx.pragma_update(None, "user_version", known)
                    .map_err(|e| open_err(e.to_string()))?;
            }
            tx.commit().map_err(|e| open_err(e.to_string()))?;
        }
        Ok(SqliteStore {
            path: path.to_owned(),
            conn: Mutex::new(conn),
            cache: Mutex::new(Cache::default()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Caps the file at about `bytes`: a write that would grow it further fails
    /// as if the disk were full (and fails the running trees, cleanly).
    pub fn set_max_bytes(&self, bytes: u64) -> Result<(), Error> {
        let conn = self.conn()?;
        let page: i64 = conn
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .map_err(sql(&self.path))?;
        conn.pragma_update(None, "max_page_count", (bytes as i64 / page).max(1))
            .map_err(sql(&self.path))
    }

    fn conn(&self) -> Result<std::sync::MutexGuard<'_, Connection>, Error> {
        self.conn
            .lock()
            .map_err(|_| Error::Store("the store connection was poisoned".into()))
    }
}

/// A state as a checkpoint row keeps it: a JSON array (no key names), its
/// history and shared values by id. Fields, in order: agent id (null when it is
/// the run id), agent type, run id, parent id (null when it is the last
/// ancestor), ancestor run ids, child run ids, output, system prompt blob,
/// tool definitions blob, context tokens, steps remaining, credits, direct
/// credits, status, step, children spawned, inherited.
#[derive(Serialize)]
struct StateRow<'a>(
    Option<&'a str>,
    &'a Option<String>,
    &'a str,
    Option<&'a str>,
    &'a [String],
    &'a [String],
    &'a Option<Value>,
    i64,
    i64,
    u64,
    u32,
    f64,
    f64,
    AgentStatus,
    u32,
    u32,
    usize,
);

/// Where the shared values' blob ids sit in a `StateRow`.
const SYSTEM_PROMPT_AT: usize = 7;
const TOOLS_AT: usize = 8;

#[derive(Deserialize)]
struct StateRowOwned(
    Option<String>,
    Option<String>,
    String,
    Option<String>,
    Vec<String>,
    Vec<String>,
    Option<Value>,
    i64,
    i64,
    u64,
    u32,
    f64,
    f64,
    AgentStatus,
    u32,
    u32,
    usize,
);

fn put_blob(tx: &Transaction<'_>, body: &[u8]) -> rusqlite::Result<i64> {
    let mut stmt = tx.prepare_cached("INSERT INTO blobs(body) VALUES (?1)")?;
    stmt.execute([body])?;
    Ok(tx.last_insert_rowid())
}

fn encode_ids(ids: &[i64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids.len() * 3);
    for &id in ids {
        let mut v = id as u64;
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
    }
    out
}

fn decode_ids(bytes: &[u8]) -> Result<Vec<i64>, Error> {
    let mut ids = Vec::new();
    let mut v: u64 = 0;
    let mut shift = 0;
    for &byte in bytes {
        if shift > 63 {
            return Err(Error::Store(
                "a checkpoint's message list is corrupt".into(),
            ));
        }
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            ids.push(v as i64);
            v = 0;
            shift = 0;
        } else {
            shift += 7;
        }
    }
    if shift != 0 {
        return Err(Error::Store(
            "a checkpoint's message list is corrupt".into(),
        ));
    }
    Ok(ids)
}

fn to_json<T: Serialize + ?Sized>(value: &T) -> rusqlite::Result<String> {
    serde_json::to_string(value).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

/// The writer's side: one batch in one transaction.
struct Batch<'c, 't> {
    tx: &'t Transaction<'c>,
    cache: &'t mut Cache,
    /// Runs that started in this batch.
    runs: HashMap<Arc<str>, RunRow>,
    /// Each tree's journal chunk being filled.
    journal: HashMap<Arc<str>, Chunk>,
}

struct RunRow {
    tree_id: Arc<str>,
    agent_id: String,
    parent_run_id: Option<String>,
    agent_type: String,
    depth: i64,
    inherited: i64,
    started_ms: i64,
    end: Option<RunEnd>,
}

struct RunEnd {
    status: &'static str,
    error: Option<String>,
    finished_ms: i64,
    checkpoint: i64,
}

impl Batch<'_, '_> {
    /// Writes the runs that started in this batch (a resumed run starts again:
    /// it is running, and keeps no final state of an earlier life).
    fn flush_runs(&mut self) -> rusqlite::Result<()> {
        let mut stmt = self.tx.prepare_cached(
            "INSERT INTO runs(run_id, tree_id, agent_id, parent_run_id, agent_type, depth,
                              inherited, status, error, started_ms, finished_ms, final_checkpoint)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
             ON CONFLICT(run_id) DO UPDATE SET status = excluded.status, error = excluded.error,
                 finished_ms = excluded.finished_ms, final_checkpoint = excluded.final_checkpoint",
        )?;
        for (run_id, row) in self.runs.drain() {
            let end = row.end.as_ref();
            stmt.execute(params![
                &*run_id,
                &*row.tree_id,
                row.agent_id,
                row.parent_run_id,
                row.agent_type,
                row.depth,
                row.inherited,
                end.map_or("running", |e| e.status),
                end.and_then(|e| e.error.as_deref()),
                row.started_ms,
                end.map(|e| e.finished_ms),
                end.map(|e| e.checkpoint),
            ])?;
        }
        Ok(())
    }

    fn message_id(&mut self, message: &Arc<Message>) -> rusqlite::Result<i64> {
        let key = Arc::as_ptr(message) as usize;
        if let Some((_, id)) = self.cache.messages.get(&key) {
            return Ok(*id);
        }
        let id = put_blob(self.tx, to_json(&**message)?.as_bytes())?;
        self.cache.messages.insert(key, (message.clone(), id));
        Ok(id)
    }

    fn text_id(&mut self, text: &Arc<str>) -> rusqlite::Result<i64> {
        let key = Arc::as_ptr(text) as *const u8 as usize;
        if let Some((_, id)) = self.cache.texts.get(&key) {
            return Ok(*id);
        }
        let id = put_blob(self.tx, to_json(&**text)?.as_bytes())?;
        self.cache.texts.insert(key, (text.clone(), id));
        Ok(id)
    }

    fn tools_id(&mut self, tools: &ToolDefinitions) -> rusqlite::Result<i64> {
        let key = Arc::as_ptr(tools) as usize;
        if let Some((_, id)) = self.cache.tools.get(&key) {
            return Ok(*id);
        }
        let id = put_blob(self.tx, to_json(&**tools)?.as_bytes())?;
        self.cache.tools.insert(key, (tools.clone(), id));
        Ok(id)
    }

    /// Writes a checkpoint (or a final state) as a delta on the run's last one.
    fn checkpoint(
        &mut self,
        at_ms: u64,
        state: &AgentState,
        point: (u32, u32, usize),
        is_final: bool,
    ) -> rusqlite::Result<i64> {
        let (step, children_spawned, inherited) = point;
        let history = &state.message_history;
        let (base, keep, chain) = match self.cache.last.get(&state.run_id) {
            Some((id, previous, chain)) if *chain < MAX_CHAIN => {
                let keep = previous
                    .iter()
                    .zip(history.iter())
                    .take_while(|(a, b)| Arc::ptr_eq(a, b))
                    .count();
                (Some(*id), keep, chain + 1)
            }
            _ => (None, 0, 0),
        };
        let mut appended = Vec::with_capacity(history.len() - keep);
        for message in history.iter().skip(keep) {
            appended.push(self.message_id(message)?);
        }
        let row = StateRow(
            (state.agent_id != state.run_id).then_some(state.agent_id.as_str()),
            &state.agent_type,
            &state.run_id,
            state
                .parent_id
                .as_deref()
                .filter(|p| state.ancestor_run_ids.last().map(String::as_str) != Some(*p)),
            &state.ancestor_run_ids,
            &state.child_run_ids,
            &state.output,
            self.text_id(&state.system_prompt)?,
            self.tools_id(&state.tool_definitions)?,
            state.context_token_count,
            state.steps_remaining,
            state.credits_used,
            state.direct_credits_used,
            state.status,
            step,
            children_spawned,
            inherited,
        );
        let mut stmt = self.tx.prepare_cached(
            "INSERT INTO checkpoints(run_id, step, final, base, keep, appended, state, at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        stmt.execute(params![
            state.run_id,
            step,
            is_final,
            base,
            keep as i64,
            encode_ids(&appended),
            to_json(&row)?,
            at_ms as i64,
        ])?;
        let id = self.tx.last_insert_rowid();
        if is_final {
            self.cache.last.remove(&state.run_id);
        } else {
            self.cache
                .last
                .insert(state.run_id.clone(), (id, history.clone(), chain));
        }
        Ok(id)
    }

    fn tree(&mut self, tree: &TreeRecord) -> rusqlite::Result<()> {
        let mut stmt = self.tx.prepare_cached(
            "INSERT INTO trees(tree_id, root_run_id, agent, prompt, params, model, limits, status,
                               started_ms, heartbeat_ms, owner, origin)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', ?8, ?9, ?10, ?11)
             ON CONFLICT(tree_id) DO UPDATE SET status = 'running', error = NULL,
                 finished_ms = NULL, heartbeat_ms = excluded.heartbeat_ms,
                 owner = excluded.owner, resumes = resumes + 1",
        )?;
        stmt.execute(params![
            tree.tree_id,
            tree.root_run_id,
            tree.agent,
            tree.prompt,
            tree.params.as_ref().map(to_json).transpose()?,
            tree.model,
            to_json(&tree.limits)?,
            tree.started_ms as i64,
            now_ms() as i64,
            super::owner_id(),
            tree.origin,
        ])?;
        Ok(())
    }

    fn event(
        &mut self,
        event: &Event,
        last_seq: &mut HashMap<Arc<str>, u64>,
    ) -> rusqlite::Result<()> {
        let tree_id = &*event.tree_id;
        let run_id = &*event.run_id;
        let at = event.at_ms as i64;
        let seq = last_seq.entry(event.tree_id.clone()).or_insert(0);
        *seq = (*seq).max(event.seq);
        match &event.kind {
            EventKind::AgentStarted {
                agent_id,
                agent_type,
                parent_run_id,
                depth,
                inherited,
            } => {
                // Kept for the end of the batch: a run that also ends in this
                // batch is written once.
                self.runs.insert(
                    event.run_id.clone(),
                    RunRow {
                        tree_id: event.tree_id.clone(),
                        agent_id: agent_id.clone(),
                        parent_run_id: parent_run_id.clone(),
                        agent_type: agent_type.clone(),
                        depth: *depth as i64,
                        inherited: *inherited as i64,
                        started_ms: at,
                        end: None,
                    },
                );
            }
            EventKind::Checkpointed { checkpoint } => {
                let c = checkpoint;
                let point = (c.step, c.children_spawned, c.inherited);
                self.checkpoint(event.at_ms, &c.state, point, false)?;
                return Ok(());
            }
            EventKind::ModelDelta { .. } => return Ok(()),
            EventKind::ModelResponded {
                step,
                usage,
                reply: Some(reply),
                ..
            } => {
                let reply = self.message_id(reply)?;
                let mut stmt = self.tx.prepare_cached(
                    "INSERT OR REPLACE INTO model_calls(run_id, step, reply, input_tokens,
                         output_tokens, cache_read, cache_write, cost, at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                )?;
                stmt.execute(params![
                    run_id,
                    step,
                    reply,
                    usage.input_tokens as i64,
                    usage.output_tokens as i64,
                    usage.cache_read_tokens as i64,
                    usage.cache_write_tokens as i64,
                    usage.cost,
                    at
                ])?;
            }
            _ => {}
        }
        if let Some(state) = event.kind.final_state() {
            let id = self.checkpoint(event.at_ms, state, (0, 0, 0), true)?;
            let error = match &event.kind {
                EventKind::AgentFailed { error, .. } => Some(error.as_str()),
                _ => state.error_message(),
            };
            let status = state.status.as_str();
            let end = RunEnd {
                status,
                error: error.map(str::to_owned),
                finished_ms: at,
                checkpoint: id,
            };
            match self.runs.get_mut(&event.run_id) {
                Some(row) => row.end = Some(end),
                None => {
                    let mut stmt = self.tx.prepare_cached(
                        "UPDATE runs SET status = ?2, error = ?3, finished_ms = ?4,
                             final_checkpoint = ?5
                         WHERE run_id = ?1",
                    )?;
                    stmt.execute(params![run_id, status, end.error, at, id])?;
                }
            }
            if state.parent_id.is_none() {
                let mut stmt = self.tx.prepare_cached(
                    "UPDATE trees SET status = ?2, error = ?3, finished_ms = ?4
                     WHERE tree_id = ?1 AND root_run_id = ?5",
                )?;
                stmt.execute(params![tree_id, status, error, at, run_id])?;
            }
        }
        // The journal is written in chunks of up to CHUNK bytes of JSON.
        let body = journal_body(&event.kind)?;
        let chunk = self
            .journal
            .entry(event.tree_id.clone())
            .or_insert_with(|| Chunk::new(event.seq));
        chunk.last = event.seq;
        chunk
            .text
            .push(if chunk.text.is_empty() { b'[' } else { b',' });
        let _ = write!(
            chunk.text,
            "{{\"seq\":{},\"runId\":{},\"atMs\":{},",
            event.seq,
            to_json(run_id)?,
            event.at_ms,
        );
        chunk
            .text
            .extend_from_slice(body.strip_prefix('{').unwrap_or("}").as_bytes());
        if chunk.text.len() >= CHUNK {
            if let Some(chunk) = self.journal.remove(&event.tree_id) {
                self.write_chunk(tree_id, chunk)?;
            }
        }
        Ok(())
    }

    /// Writes one journal chunk: a JSON array of events, LZ4-compressed (about
    /// 8× smaller: the journal is the largest part of a store).
    fn write_chunk(&mut self, tree_id: &str, mut chunk: Chunk) -> rusqlite::Result<()> {
        chunk.text.push(b']');
        let packed = lz4_flex::compress_prepend_size(&chunk.text);
        let mut stmt = self.tx.prepare_cached(
            "INSERT OR REPLACE INTO journal(tree_id, first_seq, last_seq, events)
             VALUES (?1, ?2, ?3, ?4)",
        )?;
        stmt.execute(params![
            tree_id,
            chunk.first as i64,
            chunk.last as i64,
            packed
        ])?;
        Ok(())
    }

    fn flush_journal(&mut self) -> rusqlite::Result<()> {
        let chunks: Vec<(Arc<str>, Chunk)> = self.journal.drain().collect();
        for (tree, chunk) in chunks {
            self.write_chunk(&tree, chunk)?;
        }
        Ok(())
    }
}

/// Bytes of JSON after which a journal chunk is written.
const CHUNK: usize = 64 * 1024;

struct Chunk {
    first: u64,
    last: u64,
    text: Vec<u8>,
}

impl Chunk {
    fn new(first: u64) -> Self {
        Chunk {
            first,
            last: first,
            text: Vec::with_capacity(CHUNK + 4096),
        }
    }
}

/// An event as the journal keeps it: without the states and replies, which are
/// stored once elsewhere (checkpoints, model calls).
fn journal_body(kind: &EventKind) -> rusqlite::Result<String> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Responded<'a> {
        r#type: &'static str,
        step: u32,
        usage: &'a Usage,
        tool_calls: usize,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Ended<'a> {
        r#type: &'static str,
        status: AgentStatus,
        output: &'a Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a str>,
    }
    match kind {
        EventKind::ModelResponded {
            step,
            usage,
            tool_calls,
            ..
        } => to_json(&Responded {
            r#type: kind.name(),
            step: *step,
            usage,
            tool_calls: *tool_calls,
        }),
        EventKind::AgentFinished { state }
        | EventKind::AgentCancelled { state }
        | EventKind::AgentFailed { state, .. } => to_json(&Ended {
            r#type: kind.name(),
            status: state.status,
            output: &state.output,
            error: match kind {
                EventKind::AgentFailed { error, .. } => Some(error),
                _ => None,
            },
        }),
        _ => to_json(kind),
    }
}

/// A tree's journaled events after `after` (its `seq`), in order.
fn journal(conn: &Connection, path: &Path, tree_id: &str, after: u64) -> Result<Vec<Value>, Error> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT events FROM journal WHERE tree_id = ?1 AND last_seq > ?2 ORDER BY first_seq",
        )
        .map_err(sql(path))?;
    let chunks = stmt
        .query_map(params![tree_id, after as i64], |r| r.get::<_, Vec<u8>>(0))
        .map_err(sql(path))?;
    let mut events = Vec::new();
    let bad = |e: &dyn std::fmt::Display| {
        Error::Store(format!(
            "{}: a journal chunk of {tree_id} is not valid: {e}",
            path.display()
        ))
    };
    for chunk in chunks {
        let json =
            lz4_flex::decompress_size_prepended(&chunk.map_err(sql(path))?).map_err(|e| bad(&e))?;
        let chunk: Vec<Value> = serde_json::from_slice(&json).map_err(|e| bad(&e))?;
        events.extend(
            chunk
                .into_iter()
                .filter(|e| e["seq"].as_u64().is_some_and(|s| s > after)),
        );
    }
    Ok(events)
}

/// The reading side.
struct Reader<'c> {
    conn: &'c Connection,
    path: &'c Path,
    messages: HashMap<i64, Arc<Message>>,
    texts: HashMap<i64, Arc<str>>,
    tools: HashMap<i64, ToolDefinitions>,
}

impl<'c> Reader<'c> {
    fn new(conn: &'c Connection, path: &'c Path) -> Self {
        Reader {
            conn,
            path,
            messages: HashMap::new(),
            texts: HashMap::new(),
            tools: HashMap::new(),
        }
    }

    fn corrupt(&self, what: impl std::fmt::Display) -> Error {
        Error::Store(format!("{}: {what}", self.path.display()))
    }

    fn blob(&self, id: i64) -> Result<Vec<u8>, Error> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT body FROM blobs WHERE id = ?1")
            .map_err(sql(self.path))?;
        // Written as a BLOB; a hand-edited row may hold TEXT.
        stmt.query_row([id], |r| match r.get_ref(0)? {
            rusqlite::types::ValueRef::Blob(b) | rusqlite::types::ValueRef::Text(b) => {
                Ok(Some(b.to_vec()))
            }
            _ => Ok(None),
        })
        .optional()
        .map_err(sql(self.path))?
        .flatten()
        .ok_or_else(|| self.corrupt(format!("blob {id} is missing")))
    }

    fn message(&mut self, id: i64) -> Result<Arc<Message>, Error> {
        if let Some(m) = self.messages.get(&id) {
            return Ok(m.clone());
        }
        let body = self.blob(id)?;
        let message: Message = serde_json::from_slice(&body)
            .map_err(|e| self.corrupt(format!("message {id} is not valid: {e}")))?;
        let message = Arc::new(message);
        self.messages.insert(id, message.clone());
        Ok(message)
    }

    fn text(&mut self, id: i64) -> Result<Arc<str>, Error> {
        if let Some(t) = self.texts.get(&id) {
            return Ok(t.clone());
        }
        let text: String = serde_json::from_slice(&self.blob(id)?)
            .map_err(|e| self.corrupt(format!("text {id} is not valid: {e}")))?;
        let text: Arc<str> = Arc::from(text);
        self.texts.insert(id, text.clone());
        Ok(text)
    }

    fn tools(&mut self, id: i64) -> Result<ToolDefinitions, Error> {
        if let Some(t) = self.tools.get(&id) {
            return Ok(t.clone());
        }
        let tools: ToolDefinitions = Arc::new(
            serde_json::from_slice(&self.blob(id)?)
                .map_err(|e| self.corrupt(format!("tool definitions {id} are not valid: {e}")))?,
        );
        self.tools.insert(id, tools.clone());
        Ok(tools)
    }

    /// A checkpoint, its history rebuilt from its chain of deltas.
    fn checkpoint(&mut self, id: i64) -> Result<Checkpoint, Error> {
        let mut chain: Vec<(usize, Vec<i64>)> = Vec::new();
        let mut state_json: Option<String> = None;
        let mut next = Some(id);
        while let Some(at) = next {
            let mut stmt = self
                .conn
                .prepare_cached("SELECT base, keep, appended, state FROM checkpoints WHERE id = ?1")
                .map_err(sql(self.path))?;
            let (base, keep, appended, state): (Option<i64>, i64, Vec<u8>, String) = stmt
                .query_row([at], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                .optional()
                .map_err(sql(self.path))?
                .ok_or_else(|| self.corrupt(format!("checkpoint {at} is missing")))?;
            state_json.get_or_insert(state);
            chain.push((keep as usize, decode_ids(&appended)?));
            if chain.len() > MAX_CHAIN as usize + 1 {
                return Err(self.corrupt(format!("checkpoint {id} has a cyclic chain")));
            }
            next = base;
        }
        let mut ids: Vec<i64> = Vec::new();
        for (keep, appended) in chain.into_iter().rev() {
            ids.truncate(keep);
            ids.extend(appended);
        }
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
        ) = serde_json::from_str(state_json.as_deref().unwrap_or("[]"))
            .map_err(|e| self.corrupt(format!("checkpoint {id} is not valid: {e}")))?;
        let mut history = History::new();
        for id in ids {
            history.push_shared(self.message(id)?);
        }
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
                system_prompt: self.text(system_prompt)?,
                tool_definitions: self.tools(tool_definitions)?,
                context_token_count,
                steps_remaining,
                credits_used,
                direct_credits_used,
                status,
            },
        })
    }
}

/// A model call's usage from five columns starting at `at`.
fn usage_at(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Usage> {
    Ok(Usage {
        input_tokens: r.get::<_, i64>(at)? as u64,
        output_tokens: r.get::<_, i64>(at + 1)? as u64,
        cache_read_tokens: r.get::<_, i64>(at + 2)? as u64,
        cache_write_tokens: r.get::<_, i64>(at + 3)? as u64,
        cost: r.get(at + 4)?,
    })
}

const SUMMARY: &str = "SELECT t.tree_id, t.root_run_id, t.agent, t.prompt, t.status, t.error,
        (SELECT count(*) FROM runs r WHERE r.tree_id = t.tree_id),
        (SELECT coalesce(sum(input_tokens), 0) FROM model_calls m WHERE m.run_id IN (SELECT run_id FROM runs r WHERE r.tree_id = t.tree_id)),
        (SELECT coalesce(sum(output_tokens), 0) FROM model_calls m WHERE m.run_id IN (SELECT run_id FROM runs r WHERE r.tree_id = t.tree_id)),
        (SELECT coalesce(sum(cost), 0.0) FROM model_calls m WHERE m.run_id IN (SELECT run_id FROM runs r WHERE r.tree_id = t.tree_id)),
        t.started_ms, t.finished_ms, t.heartbeat_ms, t.resumes, t.owner
    FROM trees t";

fn summary_row(r: &rusqlite::Row<'_>, now: u64) -> rusqlite::Result<TreeSummary> {
    let mut status: String = r.get(4)?;
    let heartbeat: i64 = r.get(12)?;
    let owner: String = r.get(14)?;
    if status == "running"
        && (now.saturating_sub(heartbeat as u64) > STALE_AFTER_MS || super::owner_gone(&owner))
    {
        status = "interrupted".into();
    }
    Ok(TreeSummary {
        tree_id: r.get(0)?,
        root_run_id: r.get(1)?,
        agent: r.get(2)?,
        prompt: r.get(3)?,
        status,
        error: r.get(5)?,
        agents: r.get::<_, i64>(6)? as u64,
        input_tokens: r.get::<_, i64>(7)? as u64,
        output_tokens: r.get::<_, i64>(8)? as u64,
        cost: r.get(9)?,
        started_ms: r.get::<_, i64>(10)? as u64,
        finished_ms: r.get::<_, Option<i64>>(11)?.map(|v| v as u64),
        resumes: r.get::<_, i64>(13)? as u64,
    })
}

const NODE: &str = "SELECT r.run_id, r.parent_run_id, r.agent_type, r.depth, r.status, r.error,
        (SELECT count(*) FROM model_calls m WHERE m.run_id = r.run_id),
        (SELECT coalesce(sum(input_tokens), 0) FROM model_calls m WHERE m.run_id = r.run_id),
        (SELECT coalesce(sum(output_tokens), 0) FROM model_calls m WHERE m.run_id = r.run_id),
        (SELECT coalesce(sum(cost), 0.0) FROM model_calls m WHERE m.run_id = r.run_id),
        r.started_ms, r.finished_ms, r.final_checkpoint
    FROM runs r";

fn node_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(RunNode, Option<i64>)> {
    Ok((
        RunNode {
            run_id: r.get(0)?,
            parent_run_id: r.get(1)?,
            agent_type: r.get(2)?,
            depth: r.get::<_, i64>(3)? as u64,
            status: r.get(4)?,
            error: r.get(5)?,
            steps: r.get::<_, i64>(6)? as u64,
            input_tokens: r.get::<_, i64>(7)? as u64,
            output_tokens: r.get::<_, i64>(8)? as u64,
            cost: r.get(9)?,
            started_ms: r.get::<_, i64>(10)? as u64,
            finished_ms: r.get::<_, Option<i64>>(11)?.map(|v| v as u64),
        },
        r.get(12)?,
    ))
}

impl SqliteStore {
    fn tree_exists(&self, conn: &Connection, tree_id: &str) -> Result<(), Error> {
        let found: Option<i64> = conn
            .query_row("SELECT 1 FROM trees WHERE tree_id = ?1", [tree_id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql(&self.path))?;
        found
            .map(|_| ())
            .ok_or_else(|| Error::UnknownTree(tree_id.to_owned()))
    }

    fn nodes(
        &self,
        conn: &Connection,
        tree_id: &str,
    ) -> Result<Vec<(RunNode, Option<i64>)>, Error> {
        let mut stmt = conn
            .prepare(&format!(
                "{NODE} WHERE r.tree_id = ?1 ORDER BY r.started_ms, r.rowid"
            ))
            .map_err(sql(&self.path))?;
        let rows = stmt
            .query_map([tree_id], node_row)
            .map_err(sql(&self.path))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql(&self.path))?;
        Ok(rows)
    }

    fn latest_checkpoint(&self, conn: &Connection, run_id: &str) -> Result<Option<i64>, Error> {
        conn.query_row(
            "SELECT max(id) FROM checkpoints WHERE run_id = ?1 AND final = 0",
            [run_id],
            |r| r.get(0),
        )
        .map_err(sql(&self.path))
    }
}

impl Store for SqliteStore {
    fn write(&self, batch: &[Write]) -> Result<(), Error> {
        let mut conn = self.conn()?;
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| Error::Store("the store cache was poisoned".into()))?;
        let result = (|| -> rusqlite::Result<()> {
            let tx = conn.transaction()?;
            let mut last_seq: HashMap<Arc<str>, u64> = HashMap::new();
            {
                let mut b = Batch {
                    tx: &tx,
                    cache: &mut cache,
                    runs: HashMap::with_capacity(batch.len() / 4),
                    journal: HashMap::new(),
                };
                for write in batch {
                    match write {
                        Write::Tree(tree) => b.tree(tree)?,
                        Write::Event(event) => b.event(event, &mut last_seq)?,
                        Write::Heartbeat(trees) => {
                            let mut stmt = tx.prepare_cached(
                                "UPDATE trees SET heartbeat_ms = ?2 WHERE tree_id = ?1",
                            )?;
                            for tree in trees {
                                stmt.execute(params![tree, now_ms() as i64])?;
                            }
                        }
                    }
                }
                b.flush_runs()?;
                b.flush_journal()?;
            }
            {
                let mut stmt = tx.prepare_cached(
                    "UPDATE trees SET last_seq = max(last_seq, ?2), heartbeat_ms = ?3
                     WHERE tree_id = ?1",
                )?;
                for (tree, seq) in &last_seq {
                    stmt.execute(params![&**tree, *seq as i64, now_ms() as i64])?;
                }
            }
            tx.commit()
        })();
        cache.trim();
        result.map_err(|e| {
            // What the cache says was written may have been rolled back.
            *cache = Cache::default();
            Error::Store(format!("cannot write {}: {e}", self.path.display()))
        })
    }

    fn trees(&self, filter: &TreeFilter) -> Result<Vec<TreeSummary>, Error> {
        let conn = self.conn()?;
        let now = now_ms();
        let mut stmt = conn
            .prepare(&format!(
                "{SUMMARY} ORDER BY t.started_ms DESC, t.rowid DESC"
            ))
            .map_err(sql(&self.path))?;
        let rows = stmt
            .query_map([], |r| summary_row(r, now))
            .map_err(sql(&self.path))?;
        let limit = if filter.limit == 0 {
            usize::MAX
        } else {
            filter.limit
        };
        let mut out = Vec::new();
        let mut skipped = 0;
        for row in rows {
            let row = row.map_err(sql(&self.path))?;
            if filter.status.as_ref().is_some_and(|s| *s != row.status) {
                continue;
            }
            if skipped < filter.offset {
                skipped += 1;
                continue;
            }
            out.push(row);
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    fn tree(&self, tree_id: &str) -> Result<(TreeRecord, TreeSummary), Error> {
        let conn = self.conn()?;
        self.tree_exists(&conn, tree_id)?;
        let now = now_ms();
        let summary = conn
            .query_row(&format!("{SUMMARY} WHERE t.tree_id = ?1"), [tree_id], |r| {
                summary_row(r, now)
            })
            .map_err(sql(&self.path))?;
        let (params_json, model, limits_json, origin): (
            Option<String>,
            Option<String>,
            String,
            Option<String>,
        ) = conn
            .query_row(
                "SELECT params, model, limits, origin FROM trees WHERE tree_id = ?1",
                [tree_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .map_err(sql(&self.path))?;
        let bad = |what: &str, e: serde_json::Error| {
            Error::Store(format!(
                "{}: tree {tree_id}: {what}: {e}",
                self.path.display()
            ))
        };
        let record = TreeRecord {
            tree_id: summary.tree_id.clone(),
            root_run_id: summary.root_run_id.clone(),
            agent: summary.agent.clone(),
            prompt: summary.prompt.clone(),
            params: params_json
                .map(|p| serde_json::from_str(&p))
                .transpose()
                .map_err(|e| bad("params", e))?,
            model,
            limits: serde_json::from_str(&limits_json).map_err(|e| bad("limits", e))?,
            origin,
            started_ms: summary.started_ms,
        };
        Ok((record, summary))
    }

    fn runs(&self, tree_id: &str) -> Result<Vec<RunNode>, Error> {
        let conn = self.conn()?;
        self.tree_exists(&conn, tree_id)?;
        Ok(self
            .nodes(&conn, tree_id)?
            .into_iter()
            .map(|(n, _)| n)
            .collect())
    }

    fn run(&self, run_id: &str) -> Result<StoredRun, Error> {
        let conn = self.conn()?;
        let (node, final_id) = conn
            .query_row(&format!("{NODE} WHERE r.run_id = ?1"), [run_id], node_row)
            .optional()
            .map_err(sql(&self.path))?
            .ok_or_else(|| Error::UnknownRun(run_id.to_owned()))?;
        let mut reader = Reader::new(&conn, &self.path);
        let (state, is_final) = match final_id {
            Some(id) => (Some(reader.checkpoint(id)?.state), true),
            None => match self.latest_checkpoint(&conn, run_id)? {
                Some(id) => (Some(reader.checkpoint(id)?.state), false),
                None => (None, false),
            },
        };
        Ok(StoredRun {
            node,
            state,
            is_final,
        })
    }

    fn recovery(&self, tree_id: &str) -> Result<Recovery, Error> {
        let conn = self.conn()?;
        self.tree_exists(&conn, tree_id)?;
        let mut reader = Reader::new(&conn, &self.path);
        let mut recovery = Recovery::default();
        let mut inherited_of: HashMap<String, usize> = HashMap::new();
        {
            let mut stmt = conn
                .prepare("SELECT run_id, inherited, final_checkpoint FROM runs WHERE tree_id = ?1")
                .map_err(sql(&self.path))?;
            let rows = stmt
                .query_map([tree_id], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, Option<i64>>(2)?,
                    ))
                })
                .map_err(sql(&self.path))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql(&self.path))?;
            let mut agents = HashSet::new();
            for (run_id, inherited, final_id) in rows {
                inherited_of.insert(run_id.clone(), inherited as usize);
                let checkpoint = match final_id {
                    Some(id) => {
                        let state = reader.checkpoint(id)?.state;
                        agents.insert(state.agent_id.clone());
                        recovery
                            .finished
                            .insert(run_id, (Arc::new(state), inherited as usize));
                        continue;
                    }
                    None => self.latest_checkpoint(&conn, &run_id)?,
                };
                if let Some(id) = checkpoint {
                    let checkpoint = reader.checkpoint(id)?;
                    agents.insert(checkpoint.state.agent_id.clone());
                    recovery.checkpoints.insert(run_id, Arc::new(checkpoint));
                }
            }
            recovery.spent.agents = agents.len();
        }
        let mut stmt = conn
            .prepare(
                "SELECT run_id, step, reply, input_tokens, output_tokens, cache_read, cache_write, cost FROM model_calls
                 WHERE run_id IN (SELECT run_id FROM runs WHERE tree_id = ?1)",
            )
            .map_err(sql(&self.path))?;
        let rows = stmt
            .query_map([tree_id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, u32>(1)?,
                    r.get::<_, i64>(2)?,
                    usage_at(r, 3)?,
                ))
            })
            .map_err(sql(&self.path))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql(&self.path))?;
        let mut spent = Spent {
            agents: recovery.spent.agents,
            ..Spent::default()
        };
        for (run_id, step, reply, usage) in rows {
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
            let message = reader.message(reply)?;
            recovery
                .replies
                .insert((run_id, step), RecordedReply { message, usage });
        }
        recovery.spent = spent;
        recovery.last_seq = conn
            .query_row(
                "SELECT last_seq FROM trees WHERE tree_id = ?1",
                [tree_id],
                |r| r.get::<_, i64>(0),
            )
            .map_err(sql(&self.path))? as u64;
        Ok(recovery)
    }

    fn final_states(&self, tree_id: &str) -> Result<Vec<AgentState>, Error> {
        let conn = self.conn()?;
        self.tree_exists(&conn, tree_id)?;
        let mut stmt = conn
            .prepare(
                "SELECT final_checkpoint FROM runs WHERE tree_id = ?1 AND final_checkpoint IS NOT NULL
                 ORDER BY final_checkpoint",
            )
            .map_err(sql(&self.path))?;
        let ids = stmt
            .query_map([tree_id], |r| r.get::<_, i64>(0))
            .map_err(sql(&self.path))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql(&self.path))?;
        let mut reader = Reader::new(&conn, &self.path);
        ids.into_iter()
            .map(|id| reader.checkpoint(id).map(|c| c.state))
            .collect()
    }

    fn export(&self, tree_id: &str) -> Result<Value, Error> {
        let (record, summary) = self.tree(tree_id)?;
        let conn = self.conn()?;
        let mut reader = Reader::new(&conn, &self.path);
        let mut runs = Vec::new();
        for (node, final_id) in self.nodes(&conn, tree_id)? {
            let checkpoint = match final_id {
                Some(id) => Some(id),
                None => self.latest_checkpoint(&conn, &node.run_id)?,
            };
            let state = checkpoint.map(|id| reader.checkpoint(id)).transpose()?;
            runs.push(
                json!({"run": node, "final": final_id.is_some(), "state": state.map(|c| c.state)}),
            );
        }
        let events = journal(&conn, &self.path, tree_id, 0)?;
        let mut stmt = conn
            .prepare("SELECT run_id, step, reply, input_tokens, output_tokens, cache_read, cache_write, cost FROM model_calls
                 WHERE run_id IN (SELECT run_id FROM runs WHERE tree_id = ?1) ORDER BY at_ms, run_id, step")
            .map_err(sql(&self.path))?;
        let calls = stmt
            .query_map([tree_id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, u32>(1)?,
                    r.get::<_, i64>(2)?,
                    usage_at(r, 3)?,
                ))
            })
            .map_err(sql(&self.path))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql(&self.path))?;
        let mut model_calls = Vec::new();
        for (run_id, step, reply, usage) in calls {
            model_calls.push(json!({
                "runId": run_id, "step": step,
                "reply": *reader.message(reply)?, "usage": usage,
            }));
        }
        Ok(json!({
            "tree": record,
            "summary": summary,
            "runs": runs,
            "events": events,
            "modelCalls": model_calls,
        }))
    }

    fn events(&self, tree_id: &str, after: u64) -> Result<Vec<Value>, Error> {
        let conn = self.conn()?;
        self.tree_exists(&conn, tree_id)?;
        journal(&conn, &self.path, tree_id, after)
    }

    fn gc(&self, cutoff_ms: u64) -> Result<GcReport, Error> {
        let mut conn = self.conn()?;
        let tx = conn.transaction().map_err(sql(&self.path))?;
        let trees: Vec<String> = {
            let mut stmt = tx
                .prepare("SELECT tree_id FROM trees WHERE status != 'running' AND finished_ms < ?1")
                .map_err(sql(&self.path))?;
            stmt.query_map([cutoff_ms as i64], |r| r.get(0))
                .map_err(sql(&self.path))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql(&self.path))?
        };
        for tree in &trees {
            for table in ["model_calls", "checkpoints"] {
                tx.execute(
                    &format!(
                        "DELETE FROM {table} WHERE run_id IN (SELECT run_id FROM runs WHERE tree_id = ?1)"
                    ),
                    [tree],
                )
                .map_err(sql(&self.path))?;
            }
            for table in ["journal", "runs", "trees"] {
                tx.execute(&format!("DELETE FROM {table} WHERE tree_id = ?1"), [tree])
                    .map_err(sql(&self.path))?;
            }
        }
        // Blobs still referred to by what is left.
        let mut live: HashSet<i64> = HashSet::new();
        {
            let mut stmt = tx
                .prepare("SELECT appended, state FROM checkpoints")
                .map_err(sql(&self.path))?;
            let mut rows = stmt.query([]).map_err(sql(&self.path))?;
            while let Some(row) = rows.next().map_err(sql(&self.path))? {
                let appended: Vec<u8> = row.get(0).map_err(sql(&self.path))?;
                live.extend(decode_ids(&appended)?);
                let state: String = row.get(1).map_err(sql(&self.path))?;
                let state: Value = serde_json::from_str(&state)
                    .map_err(|e| Error::Store(format!("a checkpoint is not valid: {e}")))?;
                for at in [SYSTEM_PROMPT_AT, TOOLS_AT] {
                    if let Some(id) = state.get(at).and_then(Value::as_i64) {
                        live.insert(id);
                    }
                }
            }
            let mut stmt = tx
                .prepare("SELECT reply FROM model_calls")
                .map_err(sql(&self.path))?;
            let replies = stmt
                .query_map([], |r| r.get::<_, i64>(0))
                .map_err(sql(&self.path))?;
            for id in replies {
                live.insert(id.map_err(sql(&self.path))?);
            }
        }
        let all: Vec<i64> = {
            let mut stmt = tx
                .prepare("SELECT id FROM blobs")
                .map_err(sql(&self.path))?;
            stmt.query_map([], |r| r.get(0))
                .map_err(sql(&self.path))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql(&self.path))?
        };
        let mut blobs = 0;
        {
            let mut stmt = tx
                .prepare("DELETE FROM blobs WHERE id = ?1")
                .map_err(sql(&self.path))?;
            for id in all.into_iter().filter(|id| !live.contains(id)) {
                stmt.execute([id]).map_err(sql(&self.path))?;
                blobs += 1;
            }
        }
        tx.commit().map_err(sql(&self.path))?;
        // Blob ids the writer cached may be gone now.
        if let Ok(mut cache) = self.cache.lock() {
            *cache = Cache::default();
        }
        Ok(GcReport {
            trees: trees.len() as u64,
            blobs,
        })
    }
}

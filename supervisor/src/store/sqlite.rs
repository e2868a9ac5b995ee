//! The embedded store: one SQLite file in WAL mode.
//!
//! A tree is stored as a log: each batch the writer takes appends one
//! *segment* per tree, an LZ4-compressed JSON array of records in event order:
//! the tree's events (its journal), the messages seen for the first time, the
//! checkpoints and final states, and the model replies. A `trees` row keeps
//! what listing needs (status, heartbeat, totals). Writing is then one insert
//! per tree per batch; reading a tree (show, resume, replay, export) replays
//! its segments.
//!
//! History is shared (`Arc`) between a run's checkpoints and with its
//! children, so a message is known by its address while the writer holds it
//! and written once, the first time it is seen; a checkpoint refers to
//! messages by id, as the previous checkpoint of its run plus the messages
//! appended since, so a long history is never rewritten whole.

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
    Fenced, GcReport, RunNode, Store, StoredRun, TreeFilter, TreeRecord, TreeSummary, Write,
};
use crate::error::Error;
use crate::recovery::{RecordedReply, Recovery, Spent};
use crate::tree::now_ms;

/// "ARBR": tells an Arbor store from any other SQLite file.
const APPLICATION_ID: i64 = 0x4152_4252;

/// Migrations, in order; `PRAGMA user_version` is how many have been applied.
/// Reads touch only what the first one made, so a read-only open can read an
/// older store without migrating it.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE trees (
    tree_id       TEXT PRIMARY KEY,
    root_run_id   TEXT NOT NULL,
    agent         TEXT NOT NULL,
    prompt        TEXT NOT NULL,
    params        TEXT,
    model         TEXT,
    limits        TEXT NOT NULL,
    origin        TEXT,
    history       TEXT,
    status        TEXT NOT NULL,
    error         TEXT,
    started_ms    INTEGER NOT NULL,
    finished_ms   INTEGER,
    heartbeat_ms  INTEGER NOT NULL,
    owner         TEXT NOT NULL,
    last_seq      INTEGER NOT NULL DEFAULT 0,
    next_id       INTEGER NOT NULL DEFAULT 1,
    segments      INTEGER NOT NULL DEFAULT 0,
    resumes       INTEGER NOT NULL DEFAULT 0,
    agents        INTEGER NOT NULL DEFAULT 0,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cost          REAL NOT NULL DEFAULT 0
);
CREATE INDEX trees_started ON trees(started_ms);
CREATE TABLE segments (
    tree_id TEXT NOT NULL,
    n       INTEGER NOT NULL,
    body    BLOB NOT NULL,
    PRIMARY KEY (tree_id, n)
) WITHOUT ROWID;
"#,
    // 2: fencing. Every claim of a tree (its start, a resume, an adoption)
    // takes the next epoch; a process writes a tree only while the row still
    // has the epoch it claimed with.
    "ALTER TABLE trees ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;",
    // 3: what each tree started with (its config, without secrets), kept
    // once per distinct text and named by its SHA-256.
    r#"
CREATE TABLE configs (
    hash TEXT PRIMARY KEY,
    text TEXT NOT NULL
) WITHOUT ROWID;
ALTER TABLE trees ADD COLUMN config TEXT;
"#,
];

/// The key of a config text in `configs`.
fn config_hash(text: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// How long a write waits for another process holding the file's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Batches tried when another process keeps the file locked (each try waits
/// up to `BUSY_TIMEOUT`).
const BUSY_RETRIES: u64 = 6;

/// A checkpoint chain longer than this is cut with a full list of message ids.
const MAX_CHAIN: u32 = 256;

/// Bytes of JSON after which a segment is closed and a new one begun.
const SEGMENT: usize = 256 * 1024;

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
struct TreeCache {
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
    end: Option<(&'static str, Option<String>, u64)>,
    segment: Vec<u8>,
}

pub struct SqliteStore {
    path: PathBuf,
    conn: Mutex<Connection>,
    cache: Mutex<HashMap<Arc<str>, TreeCache>>,
    buffers: Mutex<Buffers>,
    /// The epoch this process claimed each of its trees with. Kept apart from
    /// the cache (which a failed batch clears and reloads from the row), so a
    /// later claim by another process is never mistaken for this one's.
    claims: Mutex<HashMap<Arc<str>, u64>>,
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

    /// Opens an existing store for reading only (`runs`, `tree`, `show`,
    /// `export`, `replay`): nothing is written to it, not even a migration
    /// (reads touch only what the first schema version has, so an older store
    /// is read as it is). It opens on a read-only file too. A store in WAL
    /// mode needs its `-shm` (and `-wal`) to be there or creatable (SQLite
    /// makes them if the directory is writable); where neither is possible (a
    /// read-only filesystem) and no writes are waiting in a `-wal`, the file
    /// is read as immutable, which nothing can change there anyway.
    pub fn open_read_only(path: &Path) -> Result<Self, Error> {
        if !path.is_file() {
            return Err(Error::StoreOpen {
                path: path.display().to_string(),
                reason: "no store there (run a tree first, or pass --store)".into(),
            });
        }
        let open_err = |reason: String| Error::StoreOpen {
            path: path.display().to_string(),
            reason,
        };
        let connect = |immutable: bool| -> Result<Connection, Error> {
            let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI;
            let mut uri = url_path(path);
            uri.insert_str(0, "file:");
            uri.push_str(if immutable {
                "?immutable=1"
            } else {
                "?mode=ro"
            });
            let conn =
                Connection::open_with_flags(&uri, flags).map_err(|e| open_err(e.to_string()))?;
            conn.busy_timeout(BUSY_TIMEOUT)
                .map_err(|e| open_err(e.to_string()))?;
            Ok(conn)
        };
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        let (conn, version, tables) = loop {
            let mut conn = connect(false)?;
            let values = header_values(&mut conn);
            let cannot_index = matches!(
                values
                    .as_ref()
                    .err()
                    .and_then(rusqlite::Error::sqlite_error_code),
                Some(rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::ReadOnly)
            );
            if cannot_index {
                // The WAL index cannot be made here. Without writes waiting in
                // a -wal, the file alone is the store, and no one can write it
                // here either (that needs the -wal): read it as immutable.
                let wal = path.with_file_name(format!(
                    "{}-wal",
                    path.file_name().unwrap_or_default().to_string_lossy()
                ));
                let pending = std::fs::metadata(&wal)
                    .map(|m| m.len() > 0)
                    .unwrap_or(false);
                if pending {
                    return Err(open_err(format!(
                        "cannot read it here: its {} holds writes not yet in the store, and \
                         SQLite cannot open the store's -shm index beside it (a read-only \
                         directory or filesystem); read it where its directory is writable, \
                         or let an arbor that writes it (run, resume, serve, gc) open it there \
                         once first",
                        wal.display()
                    )));
                }
                let mut conn = connect(true)?;
                let values = header_values(&mut conn);
                let (version, tables) = check_header(path, values)?;
                break (conn, version, tables);
            }
            match check_header(path, values) {
                Err(Error::StoreOpen { reason, .. })
                    if (reason.contains("locked") || reason.contains("busy"))
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(error) => return Err(error),
                Ok((version, tables)) => break (conn, version, tables),
            }
        };
        if version < 1 || tables == 0 {
            return Err(open_err("it holds no Arbor store yet (it is empty)".into()));
        }
        // A second guard: this connection cannot write even by mistake.
        conn.pragma_update(None, "query_only", true)
            .map_err(|e| open_err(e.to_string()))?;
        Ok(SqliteStore {
            path: path.to_owned(),
            conn: Mutex::new(conn),
            cache: Mutex::new(HashMap::new()),
            buffers: Mutex::new(Buffers::default()),
            claims: Mutex::new(HashMap::new()),
        })
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
        let mut conn =
            Connection::open_with_flags(path, flags).map_err(|e| open_err(e.to_string()))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| open_err(e.to_string()))?;
        let (version, tables) = read_header(&mut conn, path)?;
        let known = MIGRATIONS.len() as i64;
        let newer = |found| Error::NewerStore {
            path: path.display().to_string(),
            found,
            known,
        };
        // Before the first table: 16 KiB pages measured faster than 4 KiB for
        // the writer's batches; an existing file keeps its own.
        if tables == 0 {
            conn.pragma_update(None, "page_size", 16384)
                .map_err(|e| open_err(e.to_string()))?;
        }
        // SQLite opens a file it may not write read-only, without an error.
        if conn
            .is_readonly(rusqlite::MAIN_DB)
            .map_err(|e| open_err(e.to_string()))?
        {
            return Err(open_err(
                "the file is read-only (runs could not be stored)".into(),
            ));
        }
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| open_err(e.to_string()))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(|e| open_err(e.to_string()))?;
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
                return Err(newer(version));
            }
            if version < known {
                for (n, migration) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
                    // The SQLite message only: the migration's SQL is no help to a user.
                    tx.execute_batch(migration).map_err(|e| {
                        let why = e
                            .sqlite_error()
                            .map_or_else(|| e.to_string(), |s| s.to_string());
                        open_err(format!("migration {} of {known} failed: {why}", n + 1))
                    })?;
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
            cache: Mutex::new(HashMap::new()),
            buffers: Mutex::new(Buffers::default()),
            claims: Mutex::new(HashMap::new()),
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

/// A path as the path part of a `file:` URI: `%`, `?` and `#` escaped.
fn url_path(path: &Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            '%' => out.push_str("%25"),
            '?' => out.push_str("%3f"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    out
}

/// Reads and checks a store's header (application id, schema version, tables)
/// in one read transaction: `(user_version, tables)` of an Arbor store (or of
/// an empty file) this build can read. Reading the header is the first thing
/// that touches the file: a file that is not SQLite fails here, before
/// anything is written.
fn read_header(conn: &mut Connection, path: &Path) -> Result<(i64, i64), Error> {
    check_header(path, header_values(conn))
}

/// `(application_id, user_version, tables)`, of one moment.
fn header_values(conn: &mut Connection) -> rusqlite::Result<(i64, i64, i64)> {
    let read = conn.transaction()?;
    let app: i64 = read.pragma_query_value(None, "application_id", |r| r.get(0))?;
    let version: i64 = read.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let tables: i64 = read.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
    read.commit()?;
    Ok((app, version, tables))
}

/// What `header_values` found, checked: each failure gets its own message
/// (a foreign file, a damaged one, and one that cannot be read are different
/// problems). A lock held by another process (creating the store meanwhile)
/// is not a sign of a foreign file: opening is tried again.
fn check_header(
    path: &Path,
    values: rusqlite::Result<(i64, i64, i64)>,
) -> Result<(i64, i64), Error> {
    let open_err = |reason: String| Error::StoreOpen {
        path: path.display().to_string(),
        reason,
    };
    let not_arbor = || Error::NotAStore {
        path: path.display().to_string(),
    };
    let (app, version, tables) = values.map_err(|e| match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            open_err(e.to_string())
        }
        Some(rusqlite::ErrorCode::NotADatabase) => not_arbor(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => open_err(format!(
            "the file is damaged (truncated or corrupt): {e}; restore it from a backup"
        )),
        Some(
            rusqlite::ErrorCode::ReadOnly
            | rusqlite::ErrorCode::CannotOpen
            | rusqlite::ErrorCode::PermissionDenied,
        ) => open_err(format!(
            "cannot read it here ({e}): a read-only directory or filesystem needs the \
             store's -wal and -shm files to be writable"
        )),
        _ => open_err(e.to_string()),
    })?;
    if app != APPLICATION_ID && (app != 0 || tables > 0) {
        return Err(not_arbor());
    }
    // Arbor's id with tables but no schema version: the file was changed
    // by something else (migrating it again would fail on every table).
    if app == APPLICATION_ID && version <= 0 && tables > 0 {
        return Err(open_err(format!(
            "the file is marked as an Arbor store but its schema version is {version} \
             (user_version): it was changed by another program; restore it from a backup"
        )));
    }
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(Error::NewerStore {
            path: path.display().to_string(),
            found: version,
            known,
        });
    }
    Ok((version, tables))
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
);

/// Where a `StateRow` keeps the output.
const OUTPUT_AT: usize = 6;

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
);

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
                delta.end = Some((state.status.as_str(), error, event.at_ms));
            }
        }
        out.open();
        // The event's own JSON object, then its place in the tree appended
        // inside it (no copy of the body).
        journal_body(&event.kind, out.0, reply_written)?;
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

/// A live event as `Store::events` gives it back once stored: the journal's
/// body with `usage` and a final event's `output` put back, then `seq`, `runId`
/// and `atMs`. `None` for what the journal leaves out (streaming deltas and
/// checkpoints). A reader that follows a tree live and from the store (a
/// resumable event stream) sees one shape either way.
pub fn journal_view(event: &Event) -> Option<Value> {
    if matches!(
        event.kind,
        EventKind::ModelDelta { .. } | EventKind::Checkpointed { .. }
    ) {
        return None;
    }
    let mut body = Vec::with_capacity(128);
    journal_body(&event.kind, &mut body, false).ok()?;
    let Ok(Value::Object(mut map)) = serde_json::from_slice::<Value>(&body) else {
        return None;
    };
    if let Some(state) = event.kind.final_state() {
        map.insert("output".into(), state.output.clone().unwrap_or(Value::Null));
    }
    map.insert("seq".into(), event.seq.into());
    map.insert("runId".into(), Value::from(&*event.run_id));
    map.insert("atMs".into(), event.at_ms.into());
    Some(Value::Object(map))
}

/// An event as the journal keeps it: without the states and replies, which are
/// stored once elsewhere in the segment (checkpoints, model calls).
fn journal_body(kind: &EventKind, out: &mut Vec<u8>, reply_written: bool) -> rusqlite::Result<()> {
    /// (Its usage is the reply record's when one was written just before it:
    /// put back when the journal is read.)
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Responded<'a> {
        r#type: &'static str,
        step: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<&'a Usage>,
        tool_calls: usize,
    }
    /// (Its output is the final state's: put back when the journal is read.)
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Ended<'a> {
        r#type: &'static str,
        status: AgentStatus,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a str>,
    }
    let written = match kind {
        EventKind::ModelResponded {
            step,
            usage,
            tool_calls,
            ..
        } => serde_json::to_writer(
            out,
            &Responded {
                r#type: kind.name(),
                step: *step,
                usage: (!reply_written).then_some(usage),
                tool_calls: *tool_calls,
            },
        ),
        EventKind::AgentFinished { state, .. }
        | EventKind::AgentCancelled { state, .. }
        | EventKind::AgentFailed { state, .. } => serde_json::to_writer(
            out,
            &Ended {
                r#type: kind.name(),
                status: state.status,
                error: match kind {
                    EventKind::AgentFailed { error, .. } => Some(error),
                    _ => state.error_message(),
                },
            },
        ),
        _ => serde_json::to_writer(out, kind),
    };
    written.map_err(json_err)
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
struct Buffers {
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

/// A state as a tree's segments hold it: its message ids and its state row.
type Point = (Vec<u64>, Value);

/// One run as a tree's segments describe it.
#[derive(Default)]
struct RunLog {
    node: Option<RunNode>,
    /// The message ids of its last checkpoint, and that checkpoint's state row.
    checkpoint: Option<Point>,
    /// The same for its final state.
    last_final: Option<Point>,
    /// Message ids of the history being rebuilt from deltas.
    ids: Vec<u64>,
    /// Where it finished among the tree's runs.
    finished_at: Option<usize>,
}

/// A tree read back from its segments.
struct TreeLog {
    tree_id: String,
    events: Vec<Value>,
    messages: HashMap<u64, Value>,
    runs: Vec<(String, RunLog)>,
    index: HashMap<String, usize>,
    replies: Vec<(String, u32, u64, Usage)>,
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
            Some("modelResponded") if !e.contains_key("usage") => {
                let step = e.get("step").and_then(Value::as_u64).unwrap_or(0) as u32;
                let usage = self
                    .replies
                    .iter()
                    .rev()
                    .find(|(run, s, _, _)| run == run_id && *s == step)
                    .map(|(_, _, _, usage)| json!(usage))
                    .unwrap_or(Value::Null);
                e.insert("usage".into(), usage);
            }
            Some("agentStarted") => {
                let node = self.run(run_id).node.get_or_insert_with(RunNode::default);
                node.run_id = run_id.to_owned();
                node.parent_run_id = str_of("parentRunId");
                node.agent_type = str_of("agentType").unwrap_or_default();
                node.depth = e.get("depth").and_then(Value::as_u64).unwrap_or(0);
                node.status = "running".into();
                node.error = None;
                node.finished_ms = None;
                if node.started_ms == 0 {
                    node.started_ms = at;
                }
            }
            Some("agentFinished" | "agentFailed" | "agentCancelled") => {
                let (status, error) = (str_of("status"), str_of("error"));
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
                node.finished_ms = Some(at);
                e.insert("output".into(), output);
            }
            _ => {}
        }
    }

    fn message(&mut self, id: u64, bad: &dyn Fn(String) -> Error) -> Result<Arc<Message>, Error> {
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

    fn state(
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
        ) = serde_json::from_value(row.clone())
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
            },
        })
    }

    fn nodes(&self) -> Vec<RunNode> {
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
            steps: 0,
            input_tokens: 0,
            output_tokens: 0,
            cost: 0.0,
            started_ms: 0,
            finished_ms: None,
        }
    }
}

const SUMMARY: &str = "SELECT tree_id, root_run_id, agent, prompt, status, error, agents,
        input_tokens, output_tokens, cost, started_ms, finished_ms, heartbeat_ms, resumes, owner
    FROM trees";

fn summary_row(r: &rusqlite::Row<'_>, now: u64) -> rusqlite::Result<TreeSummary> {
    let mut status: String = r.get(4)?;
    let heartbeat: i64 = r.get(12)?;
    let owner: String = r.get(14)?;
    if status == "running" && !super::still_running(&owner, heartbeat as u64, now) {
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

/// The tree a run belongs to: run ids are `TREE/PATH`.
fn tree_of(run_id: &str) -> &str {
    run_id.split_once('/').map_or(run_id, |(tree, _)| tree)
}

impl SqliteStore {
    /// Reads every segment of a tree.
    fn log(&self, conn: &Connection, tree_id: &str) -> Result<TreeLog, Error> {
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

    fn bad(&self, tree_id: &str) -> impl Fn(String) -> Error + use<> {
        let path = self.path.display().to_string();
        let tree_id = tree_id.to_owned();
        move |what| Error::Store(format!("{path}: tree {tree_id}: {what}"))
    }
}

impl Store for SqliteStore {
    fn write(&self, batch: &[Write]) -> Result<Vec<Fenced>, Error> {
        let mut conn = self.conn()?;
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| Error::Store("the store cache was poisoned".into()))?;
        let mut buffers = self
            .buffers
            .lock()
            .map_err(|_| Error::Store("the store buffers were poisoned".into()))?;
        let mut claims = self
            .claims
            .lock()
            .map_err(|_| Error::Store("the store claims were poisoned".into()))?;
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
                                    super::owner_id(),
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
                                Batch::tree(b.cache, &tx, &id)?;
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
                                stmt.execute(params![tree, super::owner_id()])?;
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
                    let busy = matches!(
                        e.sqlite_error_code(),
                        Some(
                            rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                        )
                    );
                    // What the cache says was written was rolled back.
                    cache.clear();
                    tries += 1;
                    if !busy || tries >= BUSY_RETRIES {
                        return Err(Error::Store(format!(
                            "cannot write {}: {e}",
                            self.path.display()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(100 * tries));
                }
            }
        }
    }

    fn trees(&self, filter: &TreeFilter) -> Result<Vec<TreeSummary>, Error> {
        let conn = self.conn()?;
        let now = now_ms();
        // The stored status narrows the rows in SQL; `running` and
        // `interrupted` are both stored as running (which one is judged by the
        // owner's liveness), so only they are told apart here, and only for
        // them is the offset counted here rather than in SQL.
        let derived = matches!(filter.status.as_deref(), Some("running" | "interrupted"));
        let stored = if derived {
            Some("running")
        } else {
            filter.status.as_deref()
        };
        let sql_offset = if derived { 0 } else { filter.offset };
        let order = "ORDER BY started_ms DESC, rowid DESC LIMIT -1 OFFSET ?2";
        let query = match stored {
            Some(_) => format!("{SUMMARY} WHERE status = ?1 {order}"),
            None => format!("{SUMMARY} WHERE ?1 IS NULL {order}"),
        };
        let mut stmt = conn.prepare(&query).map_err(sql(&self.path))?;
        let rows = stmt
            .query_map(params![stored, sql_offset as i64], |r| summary_row(r, now))
            .map_err(sql(&self.path))?;
        let limit = if filter.limit == 0 {
            usize::MAX
        } else {
            filter.limit
        };
        let offset = filter.offset - sql_offset;
        let mut out = Vec::new();
        let mut skipped = 0;
        for row in rows {
            let row = row.map_err(sql(&self.path))?;
            if filter.status.as_ref().is_some_and(|s| *s != row.status) {
                continue;
            }
            if skipped < offset {
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
        let now = now_ms();
        let summary = conn
            .query_row(&format!("{SUMMARY} WHERE tree_id = ?1"), [tree_id], |r| {
                summary_row(r, now)
            })
            .optional()
            .map_err(sql(&self.path))?
            .ok_or_else(|| Error::UnknownTree(tree_id.to_owned()))?;
        let (params_json, model, limits_json, origin, history_json): (
            Option<String>,
            Option<String>,
            String,
            Option<String>,
            Option<String>,
        ) = conn
            .query_row(
                "SELECT params, model, limits, origin, history FROM trees WHERE tree_id = ?1",
                [tree_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .map_err(sql(&self.path))?;
        // Stores from before configs were kept (read as they are) have none.
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(sql(&self.path))?;
        let config: Option<String> = if version >= 3 {
            conn.query_row(
                "SELECT c.text FROM trees t JOIN configs c ON c.hash = t.config
                 WHERE t.tree_id = ?1",
                [tree_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql(&self.path))?
        } else {
            None
        };
        let bad = self.bad(tree_id);
        let record = TreeRecord {
            tree_id: summary.tree_id.clone(),
            root_run_id: summary.root_run_id.clone(),
            agent: summary.agent.clone(),
            prompt: summary.prompt.clone(),
            params: params_json
                .map(|p| serde_json::from_str(&p))
                .transpose()
                .map_err(|e| bad(format!("params: {e}")))?,
            model,
            limits: serde_json::from_str(&limits_json).map_err(|e| bad(format!("limits: {e}")))?,
            origin,
            config: config.map(Arc::from),
            history: history_json
                .map(|h| serde_json::from_str(&h))
                .transpose()
                .map_err(|e| bad(format!("history: {e}")))?,
            started_ms: summary.started_ms,
        };
        Ok((record, summary))
    }

    fn runs(&self, tree_id: &str) -> Result<Vec<RunNode>, Error> {
        let conn = self.conn()?;
        Ok(self.log(&conn, tree_id)?.nodes())
    }

    fn run(&self, run_id: &str) -> Result<StoredRun, Error> {
        let conn = self.conn()?;
        let tree_id = tree_of(run_id);
        let mut log = match self.log(&conn, tree_id) {
            Err(Error::UnknownTree(_)) => return Err(Error::UnknownRun(run_id.to_owned())),
            other => other?,
        };
        let bad = self.bad(tree_id);
        let Some(&at) = log.index.get(run_id) else {
            return Err(Error::UnknownRun(run_id.to_owned()));
        };
        let run = &log.runs[at].1;
        let node = run
            .node
            .clone()
            .filter(|n| !n.run_id.is_empty())
            .ok_or_else(|| Error::UnknownRun(run_id.to_owned()))?;
        let (point, is_final) = match (&run.last_final, &run.checkpoint) {
            (Some(f), _) => (Some(f.clone()), true),
            (None, Some(c)) => (Some(c.clone()), false),
            (None, None) => (None, false),
        };
        let checkpoint = point.map(|p| log.state(&p, &bad)).transpose()?;
        let inherited = checkpoint.as_ref().map_or(0, |c| c.inherited);
        Ok(StoredRun {
            node,
            state: checkpoint.map(|c| c.state),
            is_final,
            inherited,
        })
    }

    fn recovery(&self, tree_id: &str) -> Result<Recovery, Error> {
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

    fn final_states(&self, tree_id: &str) -> Result<Vec<AgentState>, Error> {
        let conn = self.conn()?;
        let mut log = self.log(&conn, tree_id)?;
        let bad = self.bad(tree_id);
        let mut finals: Vec<(usize, Point)> = log
            .runs
            .iter()
            .filter_map(|(_, r)| Some((r.finished_at?, r.last_final.clone()?)))
            .collect();
        finals.sort_by_key(|(at, _)| *at);
        finals
            .into_iter()
            .map(|(_, point)| log.state(&point, &bad).map(|c| c.state))
            .collect()
    }

    fn events(&self, tree_id: &str, after: u64) -> Result<Vec<Value>, Error> {
        let conn = self.conn()?;
        let log = self.log(&conn, tree_id)?;
        Ok(log
            .events
            .into_iter()
            .filter(|e| e["seq"].as_u64().is_some_and(|s| s > after))
            .collect())
    }

    fn export(&self, tree_id: &str) -> Result<Value, Error> {
        let (record, summary) = self.tree(tree_id)?;
        let conn = self.conn()?;
        let mut log = self.log(&conn, tree_id)?;
        let bad = self.bad(tree_id);
        let mut runs = Vec::new();
        let points: Vec<(Option<RunNode>, bool, Option<Point>)> = log
            .runs
            .iter()
            .map(|(_, r)| {
                let point = r.last_final.clone().or_else(|| r.checkpoint.clone());
                (r.node.clone(), r.last_final.is_some(), point)
            })
            .collect();
        for (node, is_final, point) in points {
            let state = point.map(|p| log.state(&p, &bad)).transpose()?;
            runs.push(json!({"run": node, "final": is_final, "state": state.map(|c| c.state)}));
        }
        let mut model_calls = Vec::new();
        for (run_id, step, id, usage) in log.replies.clone() {
            model_calls.push(json!({
                "runId": run_id, "step": step, "reply": *log.message(id, &bad)?, "usage": usage,
            }));
        }
        Ok(json!({
            "tree": record,
            "summary": summary,
            "runs": runs,
            "events": log.events,
            "modelCalls": model_calls,
        }))
    }

    fn claim(&self, tree_id: &str) -> Result<u64, Error> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql(&self.path))?;
        let row: Option<(String, String, i64)> = tx
            .query_row(
                "SELECT status, owner, heartbeat_ms FROM trees WHERE tree_id = ?1",
                [tree_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(sql(&self.path))?;
        let (status, owner, heartbeat) =
            row.ok_or_else(|| Error::UnknownTree(tree_id.to_owned()))?;
        let not = |reason: String| Error::NotResumable {
            tree: tree_id.to_owned(),
            reason,
        };
        if status != "running" {
            return Err(not(format!("it already ended ({status})")));
        }
        if super::still_running(&owner, heartbeat as u64, now_ms()) {
            return Err(not(
                "another process is running it (it is alive, or its heartbeat is recent); stop that one first"
                    .into(),
            ));
        }
        // The next epoch, in the transaction that takes the tree: whoever
        // held it before writes nothing more of it.
        let epoch: i64 = tx
            .query_row(
                "UPDATE trees SET owner = ?2, heartbeat_ms = ?3, epoch = epoch + 1
                 WHERE tree_id = ?1 RETURNING epoch",
                params![tree_id, super::owner_id(), now_ms() as i64],
                |r| r.get(0),
            )
            .map_err(sql(&self.path))?;
        tx.commit().map_err(sql(&self.path))?;
        self.claims
            .lock()
            .map_err(|_| Error::Store("the store claims were poisoned".into()))?
            .insert(Arc::from(tree_id), epoch as u64);
        Ok(epoch as u64)
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
        let mut segments = 0;
        for tree in &trees {
            segments += tx
                .execute("DELETE FROM segments WHERE tree_id = ?1", [tree])
                .map_err(sql(&self.path))? as u64;
            tx.execute("DELETE FROM trees WHERE tree_id = ?1", [tree])
                .map_err(sql(&self.path))?;
        }
        // Configs no tree names any more.
        tx.execute(
            "DELETE FROM configs WHERE hash NOT IN
                 (SELECT config FROM trees WHERE config IS NOT NULL)",
            [],
        )
        .map_err(sql(&self.path))?;
        tx.commit().map_err(sql(&self.path))?;
        Ok(GcReport {
            trees: trees.len() as u64,
            segments,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::limits::TreeLimits;

    fn record(tree: &str) -> Write {
        Write::Tree(Box::new(TreeRecord {
            tree_id: tree.into(),
            root_run_id: format!("{tree}/0"),
            agent: "a".into(),
            prompt: "p".into(),
            params: None,
            model: None,
            limits: TreeLimits::default(),
            origin: None,
            config: None,
            history: None,
            started_ms: 1,
        }))
    }

    fn event(tree: &str, seq: u64) -> Write {
        Write::Event(Arc::new(Event {
            seq,
            tree_id: tree.into(),
            run_id: format!("{tree}/0").into(),
            at_ms: 1,
            kind: EventKind::StepStarted { step: seq as u32 },
        }))
    }

    /// The segment numbers of a tree, in order.
    fn segments(db: &Connection, tree: &str) -> Vec<i64> {
        let mut stmt = db
            .prepare("SELECT n FROM segments WHERE tree_id = ?1 ORDER BY n")
            .unwrap();
        stmt.query_map([tree], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// What its owner gone looks like (a crash out of sight): no live owner,
    /// an old heartbeat.
    fn abandon(db: &Connection, tree: &str) {
        db.execute(
            "UPDATE trees SET owner = '-:1', heartbeat_ms = 0 WHERE tree_id = ?1",
            [tree],
        )
        .unwrap();
    }

    /// Split brain (issue 12, defect 12): a writer paused past its lease
    /// goes on writing after another took its tree over. Its batch for that
    /// tree is refused whole (no segment, no heartbeat, no release), the
    /// rest of the batch lands, and the new owner's log stays contiguous.
    #[test]
    fn an_older_epochs_batch_is_refused_and_nothing_of_it_lands() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let old = SqliteStore::open(&path).unwrap();
        assert!(
            old.write(&[record("t"), record("u"), event("t", 1), event("u", 1)])
                .unwrap()
                .is_empty()
        );
        let db = Connection::open(&path).unwrap();
        abandon(&db, "t");
        let new = SqliteStore::open(&path).unwrap();
        assert_eq!(new.claim("t").unwrap(), 2, "the second claim of t");
        let owner: String = db
            .query_row("SELECT owner FROM trees WHERE tree_id = 't'", [], |r| {
                r.get(0)
            })
            .unwrap();
        let fenced = old
            .write(&[
                event("t", 2),
                event("u", 2),
                Write::Heartbeat(vec!["t".into(), "u".into()]),
            ])
            .unwrap();
        assert_eq!(
            fenced,
            vec![Fenced {
                tree_id: "t".into(),
                epoch: 1,
                current: 2,
                owner: owner.clone(),
            }]
        );
        assert_eq!(segments(&db, "t"), vec![1], "the fenced batch wrote to t");
        assert_eq!(segments(&db, "u"), vec![1, 2], "u's writes were lost");
        let (beat, seq): (i64, i64) = db
            .query_row(
                "SELECT heartbeat_ms, last_seq FROM trees WHERE tree_id = 't'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(seq, 1);
        assert!(beat > 0, "the new owner's heartbeat was kept");
        // Still refused later, and a release does not undo the new claim.
        let again = old
            .write(&[event("t", 3), Write::Release(vec!["t".into()])])
            .unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(segments(&db, "t"), vec![1]);
        // The new owner writes on where the log ends: no UNIQUE clash.
        assert!(new.write(&[record("t"), event("t", 2)]).unwrap().is_empty());
        assert!(new.write(&[event("t", 3)]).unwrap().is_empty());
        assert_eq!(segments(&db, "t"), vec![1, 2, 3]);
        assert_eq!(new.events("t", 0).unwrap().len(), 3);
        let (status, owner_now): (String, String) = db
            .query_row(
                "SELECT status, owner FROM trees WHERE tree_id = 't'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((status.as_str(), owner_now), ("running", owner));
    }

    /// A new tree that lands on a stored id holds no claim: it takes
    /// nothing over, and is reported fenced out.
    #[test]
    fn a_new_tree_on_a_stored_id_is_fenced_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let first = SqliteStore::open(&path).unwrap();
        first.write(&[record("t"), event("t", 1)]).unwrap();
        let second = SqliteStore::open(&path).unwrap();
        let fenced = second.write(&[record("t"), event("t", 1)]).unwrap();
        assert_eq!(fenced.len(), 1);
        assert_eq!((fenced[0].epoch, fenced[0].current), (0, 1));
        let db = Connection::open(&path).unwrap();
        assert_eq!(segments(&db, "t"), vec![1]);
        assert!(first.write(&[event("t", 2)]).unwrap().is_empty());
    }

    /// A store of schema version 1 (before epochs) is upgraded when opened
    /// for writing: its trees get epoch 0, and the next claim takes 1.
    #[test]
    fn a_store_from_before_fencing_is_upgraded_and_its_trees_can_be_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        {
            let db = Connection::open(&path).unwrap();
            db.execute_batch(MIGRATIONS[0]).unwrap();
            db.pragma_update(None, "application_id", APPLICATION_ID)
                .unwrap();
            db.pragma_update(None, "user_version", 1).unwrap();
            db.execute(
                "INSERT INTO trees(tree_id, root_run_id, agent, prompt, limits, status,
                     started_ms, heartbeat_ms, owner)
                 VALUES ('t', 't/0', 'a', 'p', '{}', 'running', 1, 0, '-:1')",
                [],
            )
            .unwrap();
        }
        let store = SqliteStore::open(&path).unwrap();
        let db = Connection::open(&path).unwrap();
        let version: i64 = db
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
        let epoch: i64 = db
            .query_row("SELECT epoch FROM trees WHERE tree_id = 't'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(epoch, 0);
        assert_eq!(store.claim("t").unwrap(), 1);
        assert!(store.write(&[event("t", 1)]).unwrap().is_empty());
        assert_eq!(segments(&db, "t"), vec![1]);
    }
}

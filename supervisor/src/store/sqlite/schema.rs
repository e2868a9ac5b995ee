//! The file itself: the schema and its migrations, opening (creating,
//! migrating, or reading only) and the checks of a file's header.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::SqliteStore;
use crate::error::Error;
use crate::store::encode::WriterState;

/// "ARBR": tells an Arbor store from any other SQLite file.
pub(super) const APPLICATION_ID: i64 = 0x4152_4252;

/// Migrations, in order; `PRAGMA user_version` is how many have been applied.
/// Reads touch only what the first one made (or look at the version first,
/// as the journal's read of `segments.last_seq` does), so a read-only open
/// can read an older store without migrating it.
pub(crate) const MIGRATIONS: &[&str] = &[
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
    // 4: the control inbox: messages for the process that owns a tree.
    r#"
CREATE TABLE controls (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    tree_id   TEXT NOT NULL,
    body      TEXT NOT NULL,
    posted_ms INTEGER NOT NULL
);
CREATE INDEX controls_tree ON controls(tree_id, id);
"#,
    // 5: each segment's highest event `seq` (0: it has no events; NULL: it
    // was written before this), so the journal past a `seq` is read from
    // the segments that hold it, not the whole log.
    "ALTER TABLE segments ADD COLUMN last_seq INTEGER;",
    // 6: no table changes: a run's first checkpoint may start from its
    // parent's last one (`"from"`, docs/store.md), which a build before
    // would read as a history without its inherited messages, so it must
    // refuse the file as newer.
    "-- checkpoints may start from the parent's",
    // 7: the principal that started each tree (a service's named caller),
    // who may see and control it; NULL for a tree started without one.
    // Reads of it look at the version first (an older store has none).
    r#"
ALTER TABLE trees ADD COLUMN principal TEXT;
CREATE INDEX trees_principal ON trees(principal, started_ms);
"#,
    // 8: follow-up turns waiting for their tree's running turn to end
    // (semantics §14), each with the turn number its root will have.
    r#"
CREATE TABLE queued_turns (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    tree_id   TEXT NOT NULL,
    turn      INTEGER NOT NULL,
    prompt    TEXT NOT NULL,
    params    TEXT,
    queued_ms INTEGER NOT NULL,
    UNIQUE (tree_id, turn)
);
"#,
    // 9: completion webhooks: one per tree that asked for one, written with
    // the tree, then each attempt's outcome; `owner` holds it for one
    // attempt until `held_ms`, under `epoch` (as trees are claimed).
    r#"
CREATE TABLE webhooks (
    tree_id    TEXT PRIMARY KEY,
    url        TEXT NOT NULL,
    state      TEXT NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    next_ms    INTEGER NOT NULL DEFAULT 0,
    error      TEXT,
    owner      TEXT,
    held_ms    INTEGER NOT NULL DEFAULT 0,
    epoch      INTEGER NOT NULL DEFAULT 0,
    created_ms INTEGER NOT NULL,
    done_ms    INTEGER
) WITHOUT ROWID;
CREATE INDEX webhooks_pending ON webhooks(next_ms) WHERE state = 'pending';
"#,
    // 10: a webhook per run that asked for one (a tree's first run, or a
    // later turn's root), keyed by that run, and a queued turn's webhook
    // until it starts; the trees' rows of 9 are their
    // first runs'.
    r#"
CREATE TABLE webhooks_by_run (
    run_id     TEXT PRIMARY KEY,
    tree_id    TEXT NOT NULL,
    url        TEXT NOT NULL,
    state      TEXT NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    next_ms    INTEGER NOT NULL DEFAULT 0,
    error      TEXT,
    owner      TEXT,
    held_ms    INTEGER NOT NULL DEFAULT 0,
    epoch      INTEGER NOT NULL DEFAULT 0,
    created_ms INTEGER NOT NULL,
    done_ms    INTEGER
) WITHOUT ROWID;
INSERT INTO webhooks_by_run(run_id, tree_id, url, state, attempts, next_ms, error, owner,
    held_ms, epoch, created_ms, done_ms)
    SELECT tree_id || '/0', tree_id, url, state, attempts, next_ms, error, owner, held_ms,
        epoch, created_ms, done_ms FROM webhooks;
DROP TABLE webhooks;
ALTER TABLE webhooks_by_run RENAME TO webhooks;
CREATE INDEX webhooks_pending ON webhooks(next_ms) WHERE state = 'pending';
CREATE INDEX webhooks_tree ON webhooks(tree_id);
ALTER TABLE queued_turns ADD COLUMN webhook TEXT;
"#,
];

/// How long a write waits for another process holding the file's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

impl SqliteStore {
    /// Opens the store at `path`, creating it (and its migrations) if needed.
    pub fn open(path: &Path) -> Result<Self, Error> {
        Self::open_with(path, true)
    }

    /// Brings the store at `path` to this build's schema, creating it if
    /// there is none: its schema version before (0: a new file) and after.
    pub fn migrate(path: &Path) -> Result<(i64, i64), Error> {
        let version = |conn: &Connection| -> Result<i64, Error> {
            conn.pragma_query_value(None, "user_version", |r| r.get(0))
                .map_err(|e| Error::StoreOpen {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                    busy: false,
                })
        };
        let before = if path.is_file() {
            version(&*Self::open_read_only(path)?.conn()?)?
        } else {
            0
        };
        let after = version(&*Self::open(path)?.conn()?)?;
        Ok((before, after))
    }

    /// Opens an existing store; fails if there is none at `path`.
    pub fn open_existing(path: &Path) -> Result<Self, Error> {
        if !path.is_file() {
            return Err(Error::StoreOpen {
                path: path.display().to_string(),
                reason: "no store there (run a tree first, or pass --store)".into(),
                busy: false,
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
                busy: false,
            });
        }
        let open_err = |reason: String| Error::StoreOpen {
            path: path.display().to_string(),
            reason,
            busy: false,
        };
        if let Some(cut) = cut_short(path) {
            return Err(open_err(cut));
        }
        let sql_err = |e: rusqlite::Error| open_sql_err(path, e);
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
            let conn = Connection::open_with_flags(&uri, flags).map_err(sql_err)?;
            conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_err)?;
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
                let (version, tables) = check_header(path, values, Access::Read)?;
                break (conn, version, tables);
            }
            match check_header(path, values, Access::Read) {
                Err(Error::StoreOpen { busy: true, .. })
                    if std::time::Instant::now() < deadline =>
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
            .map_err(sql_err)?;
        Ok(SqliteStore {
            path: path.to_owned(),
            conn: Mutex::new(conn),
            writer: Mutex::new(WriterState::default()),
        })
    }

    fn open_with(path: &Path, create: bool) -> Result<Self, Error> {
        // Another process opening (or migrating) the same file at this moment
        // can make setup fail with "locked" before the busy timeout applies.
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        loop {
            match Self::try_open(path, create) {
                Err(Error::StoreOpen { busy: true, .. })
                    if std::time::Instant::now() < deadline =>
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
            busy: false,
        };
        if let Some(cut) = cut_short(path) {
            return Err(open_err(cut));
        }
        let sql_err = |e: rusqlite::Error| open_sql_err(path, e);
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
        let mut conn =
            Connection::open_with_flags(path, flags).map_err(|e| match e.sqlite_error_code() {
                Some(
                    rusqlite::ErrorCode::CannotOpen
                    | rusqlite::ErrorCode::ReadOnly
                    | rusqlite::ErrorCode::PermissionDenied,
                ) => open_err(cannot_write_here(&e)),
                _ => sql_err(e),
            })?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_err)?;
        let (version, tables) = read_header(&mut conn, path, Access::Write)?;
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
                .map_err(sql_err)?;
        }
        // SQLite opens a file it may not write read-only, without an error.
        if conn.is_readonly(rusqlite::MAIN_DB).map_err(sql_err)? {
            return Err(open_err(
                "cannot write it here: the file, or its directory or filesystem, is \
                 read-only, so runs could not be stored (the read-only commands runs, tree, \
                 show, export and replay read it there)"
                    .into(),
            ));
        }
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql_err)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql_err)?;
        if version < known {
            // Under the write lock, and looked at again: another process may
            // have migrated the file since it was read above.
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(sql_err)?;
            let version: i64 = tx
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .map_err(sql_err)?;
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
                        Error::StoreOpen {
                            path: path.display().to_string(),
                            reason: format!("migration {} of {known} failed: {why}", n + 1),
                            busy: is_busy(&e),
                        }
                    })?;
                }
                tx.pragma_update(None, "application_id", APPLICATION_ID)
                    .map_err(sql_err)?;
                tx.pragma_update(None, "user_version", known)
                    .map_err(sql_err)?;
            }
            tx.commit().map_err(sql_err)?;
        }
        Ok(SqliteStore {
            path: path.to_owned(),
            conn: Mutex::new(conn),
            writer: Mutex::new(WriterState::default()),
        })
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
fn read_header(conn: &mut Connection, path: &Path, access: Access) -> Result<(i64, i64), Error> {
    check_header(path, header_values(conn), access)
}

/// What a store is opened for: its open errors say which was refused.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// `open_read_only`: the read-only commands.
    Read,
    /// `open`, `open_existing`: a command that writes the store.
    Write,
}

/// Why a writing command cannot open the store where it is: SQLite could
/// not open the file, or the `-wal` and `-shm` files beside it, for writing.
fn cannot_write_here(e: &rusqlite::Error) -> String {
    format!(
        "cannot write it here ({e}): a writing command (run, resume, serve, gc, migrate) \
         needs to write the store and make its -wal and -shm files beside it, which a \
         read-only directory or filesystem does not allow (the read-only commands runs, \
         tree, show, export and replay read it there)"
    )
}

/// Whether SQLite failed because another process holds the file's lock
/// (opening, and a write, is tried again then).
pub(super) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Why the SQLite file at `path` is shorter than its own header says, if
/// it is: cut (by a full disk, a copy that stopped, `truncate`) after its
/// last checkpoint. SQLite would open such a file and write past the hole,
/// corrupting it further; only a file whose header's page count is valid
/// (its "version-valid-for" matches its change counter) and that has no
/// writes waiting in a `-wal` (which a crash mid-checkpoint leaves, and
/// SQLite replays) is judged. `None` for a file that is whole, not SQLite,
/// or missing.
pub(super) fn cut_short(path: &Path) -> Option<String> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let mut header = [0u8; 100];
    file.read_exact(&mut header).ok()?;
    if &header[..16] != b"SQLite format 3\0" {
        return None;
    }
    let be32 = |at: usize| {
        u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536,
        n => u64::from(n),
    };
    let (changes, pages, valid_for) = (be32(24), u64::from(be32(28)), be32(92));
    if pages == 0 || changes != valid_for || page_size < 512 {
        return None;
    }
    let wal = path.with_file_name(format!(
        "{}-wal",
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    if std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0) {
        return None;
    }
    let expected = pages * page_size;
    (len < expected).then(|| {
        format!(
            "the file is damaged (truncated or corrupt): it has {len} bytes where its header \
             says {pages} pages of {page_size} ({expected} bytes); restore it from a backup"
        )
    })
}

/// A SQLite error opening the store at `path`, busy if it is a lock.
fn open_sql_err(path: &Path, e: rusqlite::Error) -> Error {
    Error::StoreOpen {
        path: path.display().to_string(),
        busy: is_busy(&e),
        reason: e.to_string(),
    }
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
    access: Access,
) -> Result<(i64, i64), Error> {
    let open_err = |reason: String| Error::StoreOpen {
        path: path.display().to_string(),
        reason,
        busy: false,
    };
    let not_arbor = || Error::NotAStore {
        path: path.display().to_string(),
    };
    let (app, version, tables) = values.map_err(|e| match e.sqlite_error_code() {
        _ if is_busy(&e) => open_sql_err(path, e),
        Some(rusqlite::ErrorCode::NotADatabase) => not_arbor(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => open_err(format!(
            "the file is damaged (truncated or corrupt): {e}; restore it from a backup"
        )),
        Some(
            rusqlite::ErrorCode::ReadOnly
            | rusqlite::ErrorCode::CannotOpen
            | rusqlite::ErrorCode::PermissionDenied,
        ) if access == Access::Write => open_err(cannot_write_here(&e)),
        Some(
            rusqlite::ErrorCode::ReadOnly
            | rusqlite::ErrorCode::CannotOpen
            | rusqlite::ErrorCode::PermissionDenied,
        ) => open_err(format!(
            "cannot read it here ({e}): a read-only directory or filesystem needs the \
             store's -wal and -shm files to be writable"
        )),
        _ => open_sql_err(path, e),
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

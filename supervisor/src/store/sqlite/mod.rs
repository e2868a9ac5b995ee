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

mod query;
mod schema;
#[cfg(test)]
mod tests;
mod turns;
mod webhook;
mod write;

/// The schema's migrations, for the test that both backends' have one shape.
#[cfg(all(test, feature = "postgres"))]
pub(crate) use schema::MIGRATIONS;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::Connection;

use crate::error::Error;
use crate::store::encode::WriterState;

/// The embedded `Store`: one SQLite file (see the module doc). Open it with
/// `open`, `open_existing` or `open_read_only`.
pub struct SqliteStore {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// The writer's caches and the epochs of this process's claims.
    writer: Mutex<WriterState>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> Error + '_ {
    move |e| Error::StoreIo {
        path: path.to_owned(),
        source: Box::new(e),
    }
}

impl SqliteStore {
    /// The store's file.
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
            .map_err(|_| Error::StorePoisoned("the store connection was poisoned"))
    }
}

//! The write path over the file: one batch in one immediate transaction,
//! driving the backend-neutral `Encoder` (`store/encode.rs`) and carrying
//! out its tree records, heartbeats, releases, segments and row updates.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::SqliteStore;
use super::schema::is_busy;
use crate::error::Error;
use crate::store::encode::{EncodeError, Encoder, Rows, WriterState, config_hash};
use crate::store::query::{self, Retry};
use crate::store::{Fenced, Write};
use crate::tree::now_ms;

/// Batches tried when another process keeps the file locked (each try waits
/// up to `BUSY_TIMEOUT`).
const BUSY_RETRIES: u64 = 6;

impl From<EncodeError> for rusqlite::Error {
    fn from(e: EncodeError) -> Self {
        rusqlite::Error::ToSqlConversionFailure(Box::new(e))
    }
}

fn json_err(e: serde_json::Error) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(e))
}

/// The encoder's row lookups, in the batch's transaction (which holds the
/// write lock, so a row cannot change meanwhile).
struct TxRows<'t, 'c>(&'t Transaction<'c>);

impl Rows for TxRows<'_, '_> {
    type Error = rusqlite::Error;

    fn claim_of(&mut self, tree_id: &str) -> rusqlite::Result<Option<(u64, String)>> {
        self.0
            .prepare_cached("SELECT epoch, owner FROM trees WHERE tree_id = ?1")?
            .query_row([tree_id], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
            .optional()
    }

    fn log_of(&mut self, tree_id: &str) -> rusqlite::Result<Option<(String, u64, u64)>> {
        self.0
            .prepare_cached("SELECT root_run_id, next_id, segments FROM trees WHERE tree_id = ?1")?
            .query_row([tree_id], |r| {
                Ok((
                    r.get(0)?,
                    r.get::<_, i64>(1)? as u64,
                    r.get::<_, i64>(2)? as u64,
                ))
            })
            .optional()
    }
}

/// One attempt at a batch: its transaction, committed or rolled back.
fn attempt(
    conn: &mut Connection,
    state: &mut WriterState,
    batch: &[Write],
) -> rusqlite::Result<Vec<Fenced>> {
    // The write lock is taken first (the busy timeout applies), not
    // upgraded from a read lock half-way (which fails at once).
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let mut rows = TxRows(&tx);
    let mut b = Encoder::new(state);
    for write in batch {
        match write {
            Write::Tree(tree) => {
                // A new tree takes epoch 1. A resumed one was claimed
                // (`claim`) just before: its row is taken up only if that
                // claim still stands; a new tree landing on a stored id holds
                // no claim, so it takes nothing over.
                let holding = b.holding(&tree.tree_id);
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
                         epoch, config, principal)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'running', ?10, ?11, ?12, 1,
                         ?14, ?15)
                     ON CONFLICT(tree_id) DO UPDATE SET status = 'running', error = NULL,
                         root_run_id = excluded.root_run_id, prompt = excluded.prompt,
                         params = excluded.params, history = excluded.history,
                         finished_ms = NULL, heartbeat_ms = excluded.heartbeat_ms,
                         owner = excluded.owner,
                         resumes = resumes + (trees.root_run_id = excluded.root_run_id),
                         config = COALESCE(excluded.config, trees.config)
                     WHERE trees.epoch = ?13
                     RETURNING epoch",
                )?;
                let claimed: Option<i64> = stmt
                    .query_row(
                        params![
                            tree.tree_id.as_str(),
                            tree.root_run_id.to_string(),
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
                            // The owner is set once, never by the update.
                            tree.principal,
                        ],
                        |r| r.get(0),
                    )
                    .optional()?;
                if let (Some(_), Some(url)) = (claimed, &tree.webhook) {
                    tx.prepare_cached(
                        "INSERT OR IGNORE INTO webhooks(run_id, tree_id, url, state, created_ms)
                         VALUES (?1, ?2, ?3, 'pending', ?4)",
                    )?
                    .execute(params![
                        tree.root_run_id.to_string(),
                        tree.tree_id.as_str(),
                        url,
                        now_ms() as i64
                    ])?;
                }
                b.tree_written(
                    &mut rows,
                    &tree.tree_id,
                    &tree.root_run_id.to_string(),
                    claimed.map(|e| e as u64),
                )?;
            }
            Write::Known {
                tree_id,
                messages,
                calls,
                runs,
            } => b.known(&mut rows, tree_id, messages, calls, runs)?,
            Write::Event(event) => b.event(&mut rows, event)?,
            Write::Heartbeat(trees) => {
                let mut stmt = tx.prepare_cached(
                    "UPDATE trees SET heartbeat_ms = ?2
                     WHERE tree_id = ?1 AND owner != '-:released'",
                )?;
                for tree in trees {
                    if b.holds(&mut rows, tree)? {
                        stmt.execute(params![tree.as_str(), now_ms() as i64])?;
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
                    if b.holds(&mut rows, tree)? {
                        stmt.execute(params![tree.as_str(), crate::store::owner_id()])?;
                    }
                }
            }
        }
    }
    {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO segments(tree_id, n, body, last_seq) VALUES (?1, ?2, ?3, ?4)",
        )?;
        b.segments(&mut rows, |tree, n, body, seq| {
            stmt.execute(params![&**tree, n as i64, body, seq as i64])
                .map(drop)
        })?;
    }
    {
        let updates = b.updates(&mut rows)?;
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
        for u in &updates {
            stmt.execute(params![
                &*u.tree_id,
                u.last_seq as i64,
                now_ms() as i64,
                u.next_id as i64,
                u.segments as i64,
                u.agents as i64,
                u.input_tokens as i64,
                u.output_tokens as i64,
                u.cost,
            ])?;
            if let Some((status, error, at)) = &u.end {
                end.execute(params![&*u.tree_id, status, error, *at as i64])?;
            }
        }
    }
    let done = b.finish();
    tx.commit()?;
    Ok(state.committed(done))
}

/// Whether a failed write may go through later, unchanged: `Some(true)` when
/// the disk is full (`SQLITE_FULL`: the file or its journal could not grow),
/// `Some(false)` for an I/O error of the system (`SQLITE_IOERR`, which a
/// full disk under the WAL also gives), `None` for anything else (the
/// transaction was rolled back either way).
fn unavailable(e: &rusqlite::Error) -> Option<bool> {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DiskFull) => Some(true),
        Some(rusqlite::ErrorCode::SystemIoFailure) => Some(false),
        _ => None,
    }
}

impl SqliteStore {
    /// `Store::write`: the batch in one transaction, tried again while
    /// another process holds the file's write lock.
    pub(super) fn write_batch(&self, batch: &[Write]) -> Result<Vec<Fenced>, Error> {
        let mut conn = self.conn()?;
        let mut state = self
            .writer
            .lock()
            .map_err(|_| Error::StorePoisoned("the store's writer state was poisoned"))?;
        // Another process holding the lock beyond the busy timeout is not a
        // broken store: try again a few times before failing the trees.
        query::write_batch(
            &mut state,
            |state| attempt(&mut conn, state, batch),
            |e, tries| {
                if let Some(disk_full) = unavailable(&e) {
                    // The writer keeps the batch and tries it again.
                    return Retry::Fail(Error::StoreUnavailable {
                        path: self.path.display().to_string(),
                        reason: e.to_string(),
                        disk_full,
                    });
                }
                if !is_busy(&e) || u64::from(tries) >= BUSY_RETRIES {
                    return Retry::Fail(Error::StoreWrite {
                        path: self.path.clone(),
                        source: Box::new(e),
                    });
                }
                Retry::Again(Duration::from_millis(100 * u64::from(tries)))
            },
        )
    }

    /// Records a claim this process made (`claim`, `claim_turn`, `load`).
    pub(super) fn hold(&self, tree_id: &str, epoch: u64) -> Result<(), Error> {
        self.writer
            .lock()
            .map_err(|_| Error::StorePoisoned("the store's writer state was poisoned"))?
            .claims
            .insert(Arc::from(tree_id), epoch);
        Ok(())
    }
}

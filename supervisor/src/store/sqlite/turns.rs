//! Queued follow-up turns in the file (semantics §14): the `queued_turns`
//! table, each turn taken with a claim of its tree in one transaction.

use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use super::{SqliteStore, sql};
use crate::error::Error;
use crate::store::{QueuedTurn, TreeStatus, turn_of};
use crate::tree::now_ms;
use arbor_actors::TreeId;

/// A queued turn's columns, read back.
type Row = (i64, i64, String, Option<String>, i64, Option<String>);

impl SqliteStore {
    /// `Store::queue_turn`: under the write lock, so two turns queued at
    /// once get consecutive numbers.
    pub(super) fn queue_turn_here(
        &self,
        tree: &TreeId,
        prompt: &str,
        params: Option<&Value>,
        webhook: Option<&str>,
        limit: usize,
    ) -> Result<QueuedTurn, Error> {
        let tree_id = tree.as_str();
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql(&self.path))?;
        let latest = latest_turn(&tx, tree_id).map_err(sql(&self.path))?;
        let latest = latest.ok_or_else(|| Error::UnknownTree(tree.clone()))?;
        forget_started(&tx, tree_id, latest).map_err(sql(&self.path))?;
        let (waiting, last): (i64, Option<i64>) = tx
            .query_row(
                "SELECT COUNT(*), MAX(turn) FROM queued_turns WHERE tree_id = ?1",
                [tree_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(sql(&self.path))?;
        if waiting as usize >= limit {
            return Err(Error::TurnQueueFull {
                tree: tree.clone(),
                limit,
            });
        }
        let turn = last.map_or(latest, |l| (l as u32).max(latest)) + 1;
        let queued_ms = now_ms();
        let id: i64 = tx
            .query_row(
                "INSERT INTO queued_turns(tree_id, turn, prompt, params, queued_ms, webhook)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
                params![
                    tree_id,
                    turn,
                    prompt,
                    params.map(Value::to_string),
                    queued_ms as i64,
                    webhook
                ],
                |r| r.get(0),
            )
            .map_err(sql(&self.path))?;
        tx.commit().map_err(sql(&self.path))?;
        Ok(QueuedTurn {
            id: id as u64,
            tree_id: tree.clone(),
            turn,
            prompt: prompt.to_owned(),
            params: params.cloned(),
            queued_ms,
            position: waiting as usize + 1,
            webhook: webhook.map(str::to_owned),
        })
    }

    /// `Store::queued_turns`.
    pub(super) fn queued_turns_here(&self, tree: &TreeId) -> Result<Vec<QueuedTurn>, Error> {
        let tree_id = tree.as_str();
        let conn = self.conn()?;
        let latest = latest_turn(&conn, tree_id).map_err(sql(&self.path))?;
        let latest = latest.ok_or_else(|| Error::UnknownTree(tree.clone()))?;
        let mut stmt = conn
            .prepare_cached(
                "SELECT id, turn, prompt, params, queued_ms, webhook FROM queued_turns
                 WHERE tree_id = ?1 AND turn > ?2 ORDER BY turn",
            )
            .map_err(sql(&self.path))?;
        let rows = stmt
            .query_map(params![tree_id, latest], row)
            .map_err(sql(&self.path))?
            .collect::<Result<Vec<Row>, _>>()
            .map_err(sql(&self.path))?;
        rows.into_iter()
            .enumerate()
            .map(|(at, r)| self.queued(tree, r, at + 1))
            .collect()
    }

    /// `Store::take_turn`: the next turn and the claim, in one immediate
    /// transaction.
    pub(super) fn take_turn_here(
        &self,
        tree: &TreeId,
        only: Option<u64>,
    ) -> Result<Option<(QueuedTurn, u64)>, Error> {
        let tree_id = tree.as_str();
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql(&self.path))?;
        let found: Option<(TreeStatus, String)> = tx
            .query_row(
                "SELECT status, root_run_id FROM trees WHERE tree_id = ?1",
                [tree_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(sql(&self.path))?;
        let (status, root) = found.ok_or_else(|| Error::UnknownTree(tree.clone()))?;
        forget_started(&tx, tree_id, turn_of(&root)).map_err(sql(&self.path))?;
        let next: Option<Row> = if status.is_final() {
            tx.query_row(
                "SELECT id, turn, prompt, params, queued_ms, webhook FROM queued_turns
                 WHERE tree_id = ?1 ORDER BY turn LIMIT 1",
                [tree_id],
                row,
            )
            .optional()
            .map_err(sql(&self.path))?
        } else {
            None
        };
        let next = next.filter(|r| only.is_none_or(|id| id == r.0 as u64));
        let Some(next) = next else {
            tx.commit().map_err(sql(&self.path))?;
            return Ok(None);
        };
        let epoch: i64 = tx
            .query_row(
                "UPDATE trees SET status = 'running', error = NULL, finished_ms = NULL,
                     owner = ?2, heartbeat_ms = ?3, epoch = epoch + 1
                 WHERE tree_id = ?1 RETURNING epoch",
                params![tree_id, crate::store::owner_id(), now_ms() as i64],
                |r| r.get(0),
            )
            .map_err(sql(&self.path))?;
        tx.commit().map_err(sql(&self.path))?;
        self.hold(tree_id, epoch as u64)?;
        Ok(Some((self.queued(tree, next, 1)?, epoch as u64)))
    }

    /// `Store::forget_turn`.
    pub(super) fn forget_turn_here(&self, id: u64) -> Result<(), Error> {
        self.conn()?
            .execute("DELETE FROM queued_turns WHERE id = ?1", [id as i64])
            .map_err(sql(&self.path))?;
        Ok(())
    }

    /// `Store::trees_with_queued_turns`.
    pub(super) fn trees_with_queued_turns_here(&self, limit: usize) -> Result<Vec<String>, Error> {
        let conn = self.conn()?;
        let mut stmt = conn
            .prepare_cached(
                "SELECT DISTINCT q.tree_id FROM queued_turns q
                 JOIN trees t ON t.tree_id = q.tree_id
                 WHERE t.status != 'running' LIMIT ?1",
            )
            .map_err(sql(&self.path))?;
        stmt.query_map([limit.min(i64::MAX as usize) as i64], |r| r.get(0))
            .map_err(sql(&self.path))?
            .collect::<Result<Vec<String>, _>>()
            .map_err(sql(&self.path))
    }

    /// A queued turn from its row, at `position` in its tree's queue.
    fn queued(&self, tree: &TreeId, r: Row, position: usize) -> Result<QueuedTurn, Error> {
        let (id, turn, prompt, params, queued_ms, webhook) = r;
        let params = params
            .map(|p| serde_json::from_str(&p))
            .transpose()
            .map_err(|e| self.bad(tree)(format!("a queued turn's params: {e}")))?;
        Ok(QueuedTurn {
            id: id as u64,
            tree_id: tree.clone(),
            turn: turn as u32,
            prompt,
            params,
            queued_ms: queued_ms as u64,
            position,
            webhook,
        })
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
    ))
}

/// The turn the tree's latest root names; `None` without such a tree.
fn latest_turn(conn: &rusqlite::Connection, tree_id: &str) -> rusqlite::Result<Option<u32>> {
    let root: Option<String> = conn
        .query_row(
            "SELECT root_run_id FROM trees WHERE tree_id = ?1",
            [tree_id],
            |r| r.get(0),
        )
        .optional()?;
    Ok(root.as_deref().map(turn_of))
}

/// Drops the turns that have started (their root is stored as the tree's
/// latest, or an earlier one).
fn forget_started(conn: &rusqlite::Connection, tree_id: &str, latest: u32) -> rusqlite::Result<()> {
    conn.execute(
        "DELETE FROM queued_turns WHERE tree_id = ?1 AND turn <= ?2",
        params![tree_id, latest],
    )?;
    Ok(())
}

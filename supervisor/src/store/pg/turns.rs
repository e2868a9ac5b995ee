//! Queued follow-up turns in the database (semantics §14): the
//! `queued_turns` table, each turn taken with a claim of its tree in one
//! transaction on the tree's locked row.

use serde_json::Value;
use tokio_postgres::GenericClient;

use super::PgStore;
use crate::error::Error;
use crate::store::{QueuedTurn, TreeStatus, turn_of};
use crate::tree::now_ms;
use arbor_actors::TreeId;

impl PgStore {
    /// `Store::queue_turn`: on the tree's locked row, so two turns queued
    /// at once get consecutive numbers.
    pub(super) fn queue_turn_here(
        &self,
        tree: &TreeId,
        prompt: &str,
        params: Option<&Value>,
        webhook: Option<&str>,
        limit: usize,
    ) -> Result<QueuedTurn, Error> {
        let tree_id = tree.as_str();
        self.block(async {
            let io = self.io();
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(&io)?;
            let (_, latest) = self.locked(&*tx, tree).await?;
            forget_started(&*tx, tree_id, latest).await.map_err(&io)?;
            let row = tx
                .query_one(
                    "SELECT COUNT(*), MAX(turn) FROM queued_turns WHERE tree_id = $1",
                    &[&tree_id],
                )
                .await
                .map_err(&io)?;
            let waiting = row.get::<_, i64>(0) as usize;
            if waiting >= limit {
                return Err(Error::TurnQueueFull {
                    tree: tree.clone(),
                    limit,
                });
            }
            let last: Option<i64> = row.get(1);
            let turn = last.map_or(latest, |l| (l as u32).max(latest)) + 1;
            let queued_ms = now_ms();
            let id: i64 = tx
                .query_one(
                    "INSERT INTO queued_turns(tree_id, turn, prompt, params, queued_ms, webhook)
                     VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                    &[
                        &tree_id,
                        &i64::from(turn),
                        &prompt,
                        &params.map(Value::to_string),
                        &(queued_ms as i64),
                        &webhook,
                    ],
                )
                .await
                .map_err(&io)?
                .get(0);
            tx.commit().await.map_err(&io)?;
            Ok(QueuedTurn {
                id: id as u64,
                tree_id: tree.clone(),
                turn,
                prompt: prompt.to_owned(),
                params: params.cloned(),
                queued_ms,
                position: waiting + 1,
                webhook: webhook.map(str::to_owned),
            })
        })
    }

    /// `Store::queued_turns`.
    pub(super) fn queued_turns_here(&self, tree: &TreeId) -> Result<Vec<QueuedTurn>, Error> {
        let tree_id = tree.as_str();
        let rows = self.block(async {
            let io = self.io();
            let client = self.client().await?;
            let root = client
                .query_opt(
                    "SELECT root_run_id FROM trees WHERE tree_id = $1",
                    &[&tree_id],
                )
                .await
                .map_err(&io)?
                .ok_or_else(|| Error::UnknownTree(tree.clone()))?;
            let latest = turn_of(root.get(0));
            client
                .query(
                    "SELECT id, turn, prompt, params, queued_ms, webhook FROM queued_turns
                     WHERE tree_id = $1 AND turn > $2 ORDER BY turn",
                    &[&tree_id, &i64::from(latest)],
                )
                .await
                .map_err(&io)
        })?;
        rows.iter()
            .enumerate()
            .map(|(at, r)| self.queued(tree, r, at + 1))
            .collect()
    }

    /// `Store::take_turn`: the next turn and the claim, in one transaction
    /// on the tree's locked row.
    pub(super) fn take_turn_here(
        &self,
        tree: &TreeId,
        only: Option<u64>,
    ) -> Result<Option<(QueuedTurn, u64)>, Error> {
        let tree_id = tree.as_str();
        let taken = self.block(async {
            let io = self.io();
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(&io)?;
            let (status, latest) = self.locked(&*tx, tree).await?;
            forget_started(&*tx, tree_id, latest).await.map_err(&io)?;
            let next = if status.is_final() {
                tx.query_opt(
                    "SELECT id, turn, prompt, params, queued_ms, webhook FROM queued_turns
                     WHERE tree_id = $1 ORDER BY turn LIMIT 1",
                    &[&tree_id],
                )
                .await
                .map_err(&io)?
            } else {
                None
            };
            let next = next.filter(|r| only.is_none_or(|id| id == r.get::<_, i64>("id") as u64));
            let Some(next) = next else {
                tx.commit().await.map_err(&io)?;
                return Ok(None);
            };
            let epoch: i64 = tx
                .query_one(
                    "UPDATE trees SET status = 'running', error = NULL, finished_ms = NULL,
                         owner = $2, heartbeat_ms = $3, epoch = epoch + 1
                     WHERE tree_id = $1 RETURNING epoch",
                    &[&tree_id, &crate::store::owner_id(), &(now_ms() as i64)],
                )
                .await
                .map_err(&io)?
                .get(0);
            tx.commit().await.map_err(&io)?;
            Ok::<_, Error>(Some((next, epoch as u64)))
        })?;
        let Some((next, epoch)) = taken else {
            return Ok(None);
        };
        self.writer()?.claims.insert(tree_id.into(), epoch);
        Ok(Some((self.queued(tree, &next, 1)?, epoch)))
    }

    /// `Store::forget_turn`.
    pub(super) fn forget_turn_here(&self, id: u64) -> Result<(), Error> {
        self.block(async {
            let client = self.client().await?;
            client
                .execute("DELETE FROM queued_turns WHERE id = $1", &[&(id as i64)])
                .await
                .map_err(self.io())
        })?;
        Ok(())
    }

    /// `Store::trees_with_queued_turns`.
    pub(super) fn trees_with_queued_turns_here(&self, limit: usize) -> Result<Vec<String>, Error> {
        let rows = self.block(async {
            let client = self.client().await?;
            client
                .query(
                    "SELECT DISTINCT q.tree_id FROM queued_turns q
                     JOIN trees t ON t.tree_id = q.tree_id
                     WHERE t.status != 'running' LIMIT $1",
                    &[&(limit.min(i64::MAX as usize) as i64)],
                )
                .await
                .map_err(self.io())
        })?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// The tree's row locked for this transaction: its status as stored and
    /// the turn its latest root names; `Error::UnknownTree` without it.
    async fn locked(
        &self,
        tx: &impl GenericClient,
        tree: &TreeId,
    ) -> Result<(TreeStatus, u32), Error> {
        let tree_id = tree.as_str();
        let row = tx
            .query_opt(
                "SELECT status, root_run_id FROM trees WHERE tree_id = $1 FOR UPDATE",
                &[&tree_id],
            )
            .await
            .map_err(self.io())?
            .ok_or_else(|| Error::UnknownTree(tree.clone()))?;
        let status: &str = row.get(0);
        let status: TreeStatus = status
            .parse()
            .map_err(|e: crate::store::UnknownStatus| self.bad(tree)(e.to_string()))?;
        Ok((status, turn_of(row.get(1))))
    }

    /// A queued turn from its row, at `position` in its tree's queue.
    fn queued(
        &self,
        tree: &TreeId,
        r: &tokio_postgres::Row,
        position: usize,
    ) -> Result<QueuedTurn, Error> {
        let params: Option<String> = r.get("params");
        let params = params
            .map(|p| serde_json::from_str(&p))
            .transpose()
            .map_err(|e| self.bad(tree)(format!("a queued turn's params: {e}")))?;
        Ok(QueuedTurn {
            id: r.get::<_, i64>("id") as u64,
            tree_id: tree.clone(),
            turn: r.get::<_, i64>("turn") as u32,
            prompt: r.get("prompt"),
            params,
            queued_ms: r.get::<_, i64>("queued_ms") as u64,
            position,
            webhook: r.get("webhook"),
        })
    }
}

/// Drops the turns that have started (their root is stored as the tree's
/// latest, or an earlier one).
async fn forget_started(
    tx: &impl GenericClient,
    tree_id: &str,
    latest: u32,
) -> Result<u64, tokio_postgres::Error> {
    tx.execute(
        "DELETE FROM queued_turns WHERE tree_id = $1 AND turn <= $2",
        &[&tree_id, &i64::from(latest)],
    )
    .await
}

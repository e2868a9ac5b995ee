//! Completion webhooks in the file: the `webhooks` table (see
//! `store/webhook.rs`), each claim taken under the write lock.

use rusqlite::{OptionalExtension, params};

use super::{SqliteStore, sql};
use crate::error::Error;
use crate::store::{
    WebhookClaim, WebhookRecord, WebhookResult, WebhookState, owner_id, webhook_claimable,
    webhook_record,
};
use arbor_actors::RunId;

/// The schema version that keyed the `webhooks` table by run: an older
/// file (read only) is read as having no webhooks.
const WEBHOOK_VERSION: i64 = 10;

/// A webhook's row with its run's: url, state, attempts, next, error,
/// done, owner, held, epoch, whether the run ended.
type Row = (
    String,
    String,
    i64,
    i64,
    Option<String>,
    Option<i64>,
    Option<String>,
    i64,
    i64,
    bool,
);

const SELECT: &str = "SELECT w.url, w.state, w.attempts, w.next_ms, w.error, w.done_ms, w.owner,
        w.held_ms, w.epoch,
        COALESCE(t.status <> 'running' OR t.root_run_id <> w.run_id, 0)
     FROM webhooks w LEFT JOIN trees t ON t.tree_id = w.tree_id
     WHERE w.run_id = ?1";

fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
    ))
}

impl SqliteStore {
    fn has_webhooks(&self, conn: &rusqlite::Connection) -> Result<bool, Error> {
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(sql(&self.path))?;
        Ok(version >= WEBHOOK_VERSION)
    }

    /// `Store::webhook`.
    pub(super) fn webhook_here(&self, run: &RunId) -> Result<Option<WebhookRecord>, Error> {
        let conn = self.conn()?;
        if !self.has_webhooks(&conn)? {
            return Ok(None);
        }
        let row = conn
            .query_row(SELECT, [run.to_string()], read)
            .optional()
            .map_err(sql(&self.path))?;
        row.map(|row| record(run, row)).transpose()
    }

    /// `Store::webhooks_due`: the pending rows of ended runs (their tree
    /// ended, or a later turn started) that are due, those nobody holds
    /// first (held ones cannot crowd them out of `limit`), then those
    /// claimable.
    pub(super) fn webhooks_due_here(&self, now: u64, limit: usize) -> Result<Vec<RunId>, Error> {
        let conn = self.conn()?;
        if !self.has_webhooks(&conn)? {
            return Ok(Vec::new());
        }
        let mut stmt = conn
            .prepare_cached(
                "SELECT w.run_id, w.next_ms, w.owner, w.held_ms
                 FROM webhooks w JOIN trees t ON t.tree_id = w.tree_id
                 WHERE w.state = 'pending' AND w.next_ms <= ?1
                     AND (t.status <> 'running' OR t.root_run_id <> w.run_id)
                 ORDER BY (w.owner IS NOT NULL), w.next_ms LIMIT ?2",
            )
            .map_err(sql(&self.path))?;
        let rows = stmt
            .query_map(
                params![now as i64, limit.min(i64::MAX as usize) as i64],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, Option<String>>(2)?,
                        r.get::<_, i64>(3)?,
                    ))
                },
            )
            .map_err(sql(&self.path))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql(&self.path))?;
        let mut due = Vec::new();
        for (run_id, next, owner, held) in rows {
            let holder = owner.as_deref().map(|o| (o, held as u64));
            if webhook_claimable(
                (true, next as u64, holder),
                now,
                crate::store::Store::lease_ms(self),
            ) {
                due.push(crate::store::run_id(&run_id)?);
            }
        }
        Ok(due)
    }

    /// `Store::claim_webhook`: read and claimed in one write transaction.
    pub(super) fn claim_webhook_here(
        &self,
        run: &RunId,
        now: u64,
        hold_until: u64,
    ) -> Result<Option<WebhookClaim>, Error> {
        let mut conn = self.conn()?;
        if !self.has_webhooks(&conn)? {
            return Ok(None);
        }
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql(&self.path))?;
        let row = tx
            .query_row(SELECT, [run.to_string()], read)
            .optional()
            .map_err(sql(&self.path))?;
        let Some((url, state, attempts, next, _, _, owner, held, epoch, ended)) = row else {
            return Ok(None);
        };
        let holder = owner.as_deref().map(|o| (o, held as u64));
        if state != WebhookState::Pending.as_str()
            || !webhook_claimable(
                (ended, next as u64, holder),
                now,
                crate::store::Store::lease_ms(self),
            )
        {
            return Ok(None);
        }
        let epoch = epoch + 1;
        tx.execute(
            "UPDATE webhooks SET owner = ?2, held_ms = ?3, epoch = ?4 WHERE run_id = ?1",
            params![run.to_string(), owner_id(), hold_until as i64, epoch],
        )
        .map_err(sql(&self.path))?;
        tx.commit().map_err(sql(&self.path))?;
        Ok(Some(WebhookClaim {
            run_id: run.clone(),
            tree_id: run.tree().clone(),
            url,
            attempts: attempts as u32,
            epoch: epoch as u64,
        }))
    }

    /// `Store::webhook_attempted`: written only under the claim's epoch.
    pub(super) fn webhook_attempted_here(
        &self,
        claim: &WebhookClaim,
        result: &WebhookResult,
        now: u64,
    ) -> Result<bool, Error> {
        let conn = self.conn()?;
        let (next, done) = match result {
            WebhookResult::Retry { next_ms, .. } => (*next_ms as i64, None),
            _ => (0, Some(now as i64)),
        };
        let changed = conn
            .execute(
                "UPDATE webhooks SET state = ?3, attempts = attempts + 1, next_ms = ?4,
                     error = ?5, done_ms = ?6, owner = NULL, held_ms = 0
                 WHERE run_id = ?1 AND epoch = ?2 AND state = 'pending'",
                params![
                    claim.run_id.to_string(),
                    claim.epoch as i64,
                    result.state().as_str(),
                    next,
                    result.error(),
                    done,
                ],
            )
            .map_err(sql(&self.path))?;
        Ok(changed == 1)
    }
}

/// A row read back as a record.
fn record(run: &RunId, row: Row) -> Result<WebhookRecord, Error> {
    let (url, state, attempts, next, error, done, ..) = row;
    webhook_record(run, url, &state, (attempts, next, done), error)
}

//! Completion webhooks in the database: the `webhooks` table (see
//! `store/webhook.rs`), each claim taken on the webhook's locked row, so of
//! replicas claiming one at once one gets it (the others skip it).

use super::PgStore;
use crate::error::Error;
use crate::store::{
    WebhookClaim, WebhookRecord, WebhookResult, WebhookState, owner_id, webhook_claimable,
    webhook_record,
};
use arbor_actors::RunId;

const SELECT: &str = "SELECT w.url, w.state, w.attempts, w.next_ms, w.error, w.done_ms, w.owner,
        w.held_ms, w.epoch,
        COALESCE(t.status <> 'running' OR t.root_run_id <> w.run_id, false)
     FROM webhooks w LEFT JOIN trees t ON t.tree_id = w.tree_id
     WHERE w.run_id = $1";

impl PgStore {
    /// `Store::webhook`.
    pub(super) fn webhook_here(&self, run: &RunId) -> Result<Option<WebhookRecord>, Error> {
        let run_id = run.to_string();
        let row = self.block(async {
            let client = self.client().await?;
            client
                .query_opt(SELECT, &[&run_id])
                .await
                .map_err(self.io())
        })?;
        row.map(|r| {
            webhook_record(
                run,
                r.get(0),
                r.get::<_, &str>(1),
                (r.get(2), r.get(3), r.get(5)),
                r.get(4),
            )
        })
        .transpose()
    }

    /// `Store::webhooks_due`.
    /// The run ended when its tree did or a later turn started; the rows
    /// nobody holds come first, so held ones cannot crowd them out of
    /// `limit`.
    pub(super) fn webhooks_due_here(&self, now: u64, limit: usize) -> Result<Vec<RunId>, Error> {
        let rows = self.block(async {
            let client = self.client().await?;
            client
                .query(
                    "SELECT w.run_id, w.next_ms, w.owner, w.held_ms
                     FROM webhooks w JOIN trees t ON t.tree_id = w.tree_id
                     WHERE w.state = 'pending' AND w.next_ms <= $1
                         AND (t.status <> 'running' OR t.root_run_id <> w.run_id)
                     ORDER BY (w.owner IS NOT NULL), w.next_ms LIMIT $2",
                    &[&(now as i64), &(limit.min(i64::MAX as usize) as i64)],
                )
                .await
                .map_err(self.io())
        })?;
        let mut due = Vec::new();
        for r in rows {
            let owner: Option<String> = r.get(2);
            let holder = owner.as_deref().map(|o| (o, r.get::<_, i64>(3) as u64));
            if webhook_claimable(
                (true, r.get::<_, i64>(1) as u64, holder),
                now,
                self.lease_ms,
            ) {
                due.push(r.get::<_, String>(0));
            }
        }
        due.iter()
            .map(|id: &String| crate::store::run_id(id))
            .collect()
    }

    /// `Store::claim_webhook`: on the locked row (`SKIP LOCKED`: one
    /// another replica is claiming now is not claimable here).
    pub(super) fn claim_webhook_here(
        &self,
        run: &RunId,
        now: u64,
        hold_until: u64,
    ) -> Result<Option<WebhookClaim>, Error> {
        let run_id = run.to_string();
        self.block(async {
            let io = self.io();
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(&io)?;
            let Some(r) = tx
                .query_opt(
                    format!("{SELECT} FOR UPDATE OF w SKIP LOCKED").as_str(),
                    &[&run_id],
                )
                .await
                .map_err(&io)?
            else {
                return Ok(None);
            };
            let state: &str = r.get(1);
            let owner: Option<&str> = r.get(6);
            let holder = owner.map(|o| (o, r.get::<_, i64>(7) as u64));
            let (ended, next): (bool, i64) = (r.get(9), r.get(3));
            if state != WebhookState::Pending.as_str()
                || !webhook_claimable((ended, next as u64, holder), now, self.lease_ms)
            {
                return Ok(None);
            }
            let epoch = r.get::<_, i64>(8) + 1;
            tx.execute(
                "UPDATE webhooks SET owner = $2, held_ms = $3, epoch = $4 WHERE run_id = $1",
                &[&run_id, &owner_id(), &(hold_until as i64), &epoch],
            )
            .await
            .map_err(&io)?;
            let claim = WebhookClaim {
                run_id: run.clone(),
                tree_id: run.tree().clone(),
                url: r.get(0),
                attempts: r.get::<_, i64>(2) as u32,
                epoch: epoch as u64,
            };
            tx.commit().await.map_err(&io)?;
            Ok(Some(claim))
        })
    }

    /// `Store::webhook_attempted`: written only under the claim's epoch.
    pub(super) fn webhook_attempted_here(
        &self,
        claim: &WebhookClaim,
        result: &WebhookResult,
        now: u64,
    ) -> Result<bool, Error> {
        let (next, done) = match result {
            WebhookResult::Retry { next_ms, .. } => (*next_ms as i64, None),
            _ => (0, Some(now as i64)),
        };
        let changed = self.block(async {
            let client = self.client().await?;
            client
                .execute(
                    "UPDATE webhooks SET state = $3, attempts = attempts + 1, next_ms = $4,
                         error = $5, done_ms = $6, owner = NULL, held_ms = 0
                     WHERE run_id = $1 AND epoch = $2 AND state = 'pending'",
                    &[
                        &claim.run_id.to_string(),
                        &(claim.epoch as i64),
                        &result.state().as_str(),
                        &next,
                        &result.error(),
                        &done,
                    ],
                )
                .await
                .map_err(self.io())
        })?;
        Ok(changed == 1)
    }
}

//! `Store::gc` in the database: ended trees removed, with what only they
//! used, in one transaction.

use super::PgStore;
use crate::error::Error;
use crate::store::GcReport;

impl PgStore {
    /// `Store::gc`: the trees that ended before `cutoff_ms`, with their
    /// log, controls, queued turns and webhook, and configs no tree names.
    pub(super) fn gc_here(&self, cutoff_ms: u64) -> Result<GcReport, Error> {
        self.block(async {
            let io = self.io();
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(&io)?;
            let trees: Vec<String> = tx
                .query(
                    "DELETE FROM trees WHERE status != 'running' AND finished_ms < $1
                     RETURNING tree_id",
                    &[&(cutoff_ms as i64)],
                )
                .await
                .map_err(&io)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let segments = tx
                .execute("DELETE FROM segments WHERE tree_id = ANY($1)", &[&trees])
                .await
                .map_err(&io)?;
            tx.execute("DELETE FROM controls WHERE tree_id = ANY($1)", &[&trees])
                .await
                .map_err(&io)?;
            tx.execute(
                "DELETE FROM queued_turns WHERE tree_id = ANY($1)",
                &[&trees],
            )
            .await
            .map_err(&io)?;
            tx.execute("DELETE FROM webhooks WHERE tree_id = ANY($1)", &[&trees])
                .await
                .map_err(&io)?;
            // Configs no tree names any more.
            tx.execute(
                "DELETE FROM configs c WHERE NOT EXISTS
                     (SELECT 1 FROM trees t WHERE t.config = c.hash)",
                &[],
            )
            .await
            .map_err(&io)?;
            tx.commit().await.map_err(&io)?;
            Ok(GcReport {
                trees: trees.len() as u64,
                segments,
            })
        })
    }
}

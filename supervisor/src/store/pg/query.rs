//! The `Store` port over the database: listing and reading trees, claims
//! (one transaction on the locked row), the control inbox, dump and load,
//! and collecting old trees.

use std::sync::Arc;

use arbor_actors::{AgentState, RunId, TreeId};
use serde_json::Value;
use tokio_postgres::GenericClient;

use super::PgStore;
use crate::error::Error;
use crate::recovery::Recovery;
use crate::store::log::TreeLog;
use crate::store::query::{self, Dialect, Listing, RecordTexts, SUMMARY};
use crate::store::{
    Control, Fenced, GcReport, JournalEntry, Owner, QueuedTurn, RunNode, Segment, Store, StoredRun,
    TreeDump, TreeFilter, TreeRecord, TreeRow, TreeStatus, TreeSummary, Wake, Write,
};
use crate::tree::now_ms;

/// A tree's record and summary (`record_row` reads them), and its last `seq`.
const RECORD: &str = "SELECT t.tree_id, t.root_run_id, t.agent, t.prompt, t.status, t.error,
        t.agents, t.input_tokens, t.output_tokens, t.cost, t.started_ms, t.finished_ms,
        t.heartbeat_ms, t.resumes, t.owner, t.params, t.model, t.limits, t.origin, t.history,
        t.last_seq, t.principal, c.text AS config_text
    FROM trees t LEFT JOIN configs c ON c.hash = t.config";

fn status_of(
    r: &tokio_postgres::Row,
    column: &str,
) -> Result<TreeStatus, crate::store::UnknownStatus> {
    let text: &str = r.get(column);
    text.parse()
}

impl PgStore {
    fn summary_row(&self, r: &tokio_postgres::Row, now: u64) -> Result<TreeSummary, Error> {
        let text: String = r.get("tree_id");
        let tree_id: TreeId = text.parse().map_err(|e| Error::StoreCorruptId {
            path: self.shown.clone(),
            text: text.clone(),
            reason: format!("tree id: {e}"),
        })?;
        let mut status = status_of(r, "status").map_err(|e| self.bad(&tree_id)(e.to_string()))?;
        let heartbeat = r.get::<_, i64>("heartbeat_ms") as u64;
        let owner: String = r.get("owner");
        if status == TreeStatus::Running
            && !crate::store::still_running_within(&owner, heartbeat, now, self.lease_ms)
        {
            status = TreeStatus::Interrupted;
        }
        let root: &str = r.get("root_run_id");
        let root_run_id = root
            .parse()
            .map_err(|e| self.bad(&tree_id)(format!("root run id: {e}")))?;
        Ok(TreeSummary {
            tree_id,
            root_run_id,
            agent: r.get("agent"),
            prompt: r.get("prompt"),
            status,
            error: r.get("error"),
            agents: r.get::<_, i64>("agents") as u64,
            input_tokens: r.get::<_, i64>("input_tokens") as u64,
            output_tokens: r.get::<_, i64>("output_tokens") as u64,
            cost: r.get("cost"),
            started_ms: r.get::<_, i64>("started_ms") as u64,
            finished_ms: r.get::<_, Option<i64>>("finished_ms").map(|v| v as u64),
            resumes: r.get::<_, i64>("resumes") as u64,
            principal: r.get("principal"),
        })
    }

    /// A tree's record and summary from a row `RECORD` selected.
    fn record_row(
        &self,
        row: &tokio_postgres::Row,
        now: u64,
    ) -> Result<(TreeRecord, TreeSummary), Error> {
        let summary = self.summary_row(row, now)?;
        let record = RecordTexts {
            params: row.get("params"),
            model: row.get("model"),
            limits: row.get("limits"),
            origin: row.get("origin"),
            history: row.get("history"),
            config: row.get("config_text"),
        }
        .record(&summary, &self.bad(&summary.tree_id))?;
        Ok((record, summary))
    }

    /// Reads every segment of a tree.
    async fn log(&self, client: &impl GenericClient, tree: &TreeId) -> Result<TreeLog, Error> {
        let tree_id = tree.as_str();
        let io = self.io();
        let found = client
            .query_opt("SELECT 1 FROM trees WHERE tree_id = $1", &[&tree_id])
            .await
            .map_err(&io)?;
        if found.is_none() {
            return Err(Error::UnknownTree(tree.clone()));
        }
        let rows = client
            .query(
                "SELECT body FROM segments WHERE tree_id = $1 ORDER BY n",
                &[&tree_id],
            )
            .await
            .map_err(&io)?;
        let bodies = rows.into_iter().map(|r| Ok(r.get::<_, Vec<u8>>(0)));
        TreeLog::from_segments(tree_id, bodies, &self.bad(tree))
    }

    /// A tree's log read with a connection of the pool.
    fn read_log(&self, tree: &TreeId) -> Result<TreeLog, Error> {
        self.block(async {
            let client = self.client().await?;
            self.log(&**client, tree).await
        })
    }

    /// Takes the tree for this process under the next epoch, in one
    /// transaction on its locked row (of two replicas taking one tree, the
    /// second waits for the first and then sees its claim): `check` may
    /// refuse it on its status, owner and heartbeat; `also` is more of the
    /// `UPDATE`'s assignments (each followed by `, `).
    fn take(
        &self,
        tree: &TreeId,
        also: &str,
        check: impl FnOnce(TreeStatus, &str, u64) -> Result<(), Error>,
    ) -> Result<u64, Error> {
        let tree_id = tree.as_str();
        let epoch = self.block(async {
            let io = self.io();
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(&io)?;
            let row = tx
                .query_opt(
                    "SELECT status, owner, heartbeat_ms FROM trees WHERE tree_id = $1 FOR UPDATE",
                    &[&tree_id],
                )
                .await
                .map_err(&io)?
                .ok_or_else(|| Error::UnknownTree(tree.clone()))?;
            let status = status_of(&row, "status").map_err(|e| self.bad(tree)(e.to_string()))?;
            let owner: String = row.get("owner");
            check(status, &owner, row.get::<_, i64>("heartbeat_ms") as u64)?;
            let epoch: i64 = tx
                .query_one(
                    &format!(
                        "UPDATE trees SET {also}owner = $2, heartbeat_ms = $3, epoch = epoch + 1
                         WHERE tree_id = $1 RETURNING epoch"
                    ),
                    &[&tree_id, &crate::store::owner_id(), &(now_ms() as i64)],
                )
                .await
                .map_err(&io)?
                .get(0);
            tx.commit().await.map_err(&io)?;
            Ok::<_, Error>(epoch as u64)
        })?;
        self.writer()?.claims.insert(Arc::from(tree_id), epoch);
        Ok(epoch)
    }
}

impl Store for PgStore {
    fn write(&self, batch: &[Write]) -> Result<Vec<Fenced>, Error> {
        self.write_batch(batch)
    }

    fn webhook(&self, run_id: &RunId) -> Result<Option<crate::store::WebhookRecord>, Error> {
        self.webhook_here(run_id)
    }

    fn webhooks_due(&self, now_ms: u64, limit: usize) -> Result<Vec<RunId>, Error> {
        self.webhooks_due_here(now_ms, limit)
    }

    fn claim_webhook(
        &self,
        run_id: &RunId,
        now_ms: u64,
        hold_until_ms: u64,
    ) -> Result<Option<crate::store::WebhookClaim>, Error> {
        self.claim_webhook_here(run_id, now_ms, hold_until_ms)
    }

    fn webhook_attempted(
        &self,
        claim: &crate::store::WebhookClaim,
        result: &crate::store::WebhookResult,
        now_ms: u64,
    ) -> Result<bool, Error> {
        self.webhook_attempted_here(claim, result, now_ms)
    }

    fn trees(&self, filter: &TreeFilter) -> Result<Vec<TreeSummary>, Error> {
        self.list(filter, None)
    }

    fn trees_of(&self, filter: &TreeFilter, principal: &str) -> Result<Vec<TreeSummary>, Error> {
        self.list(filter, Some(principal))
    }

    fn principal(&self, tree: &TreeId) -> Result<Option<String>, Error> {
        let tree_id = tree.as_str();
        self.block(async {
            let client = self.client().await?;
            client
                .query_opt(
                    "SELECT principal FROM trees WHERE tree_id = $1",
                    &[&tree_id],
                )
                .await
                .map_err(self.io())?
                .map(|row| row.get(0))
                .ok_or_else(|| Error::UnknownTree(tree.clone()))
        })
    }

    fn tree(&self, tree: &TreeId) -> Result<(TreeRecord, TreeSummary), Error> {
        let tree_id = tree.as_str();
        let now = now_ms();
        let row = self.block(async {
            let client = self.client().await?;
            client
                .query_opt(&format!("{RECORD} WHERE t.tree_id = $1"), &[&tree_id])
                .await
                .map_err(self.io())?
                .ok_or_else(|| Error::UnknownTree(tree.clone()))
        })?;
        self.record_row(&row, now)
    }

    fn status(&self, tree: &TreeId) -> Result<TreeStatus, Error> {
        let tree_id = tree.as_str();
        let now = now_ms();
        let row = self.block(async {
            let client = self.client().await?;
            client
                .query_opt(&format!("{SUMMARY} WHERE tree_id = $1"), &[&tree_id])
                .await
                .map_err(self.io())?
                .ok_or_else(|| Error::UnknownTree(tree.clone()))
        })?;
        Ok(self.summary_row(&row, now)?.status)
    }

    fn claim_interrupted(&self, trees: &[TreeId]) -> Result<Vec<(TreeId, u64)>, Error> {
        if trees.is_empty() {
            return Ok(Vec::new());
        }
        let tree_ids: Vec<&str> = trees.iter().map(TreeId::as_str).collect();
        let lease = self.lease_ms;
        let claimed: Vec<(String, u64)> = self.block(async {
            let io = self.io();
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(&io)?;
            // Rows another replica is claiming (or a batch is writing) are
            // skipped, not waited for: replicas adopting at once split the
            // trees, and a skipped one is there for the next look.
            let rows = tx
                .query(
                    "SELECT tree_id, owner, heartbeat_ms FROM trees
                     WHERE tree_id = ANY($1) AND status = 'running'
                     ORDER BY tree_id FOR UPDATE SKIP LOCKED",
                    &[&tree_ids],
                )
                .await
                .map_err(&io)?;
            let now = now_ms();
            let take: Vec<String> = rows
                .iter()
                .filter(|r| {
                    let row = (
                        TreeStatus::Running,
                        r.get::<_, &str>("owner"),
                        r.get::<_, i64>("heartbeat_ms") as u64,
                    );
                    crate::store::claim_refused(row, now, lease).is_none()
                })
                .map(|r| r.get("tree_id"))
                .collect();
            if take.is_empty() {
                tx.rollback().await.map_err(&io)?;
                return Ok(Vec::new());
            }
            let claimed = tx
                .query(
                    "UPDATE trees SET owner = $2, heartbeat_ms = $3, epoch = epoch + 1
                     WHERE tree_id = ANY($1) RETURNING tree_id, epoch",
                    &[&take, &crate::store::owner_id(), &(now_ms() as i64)],
                )
                .await
                .map_err(&io)?
                .iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
                .collect();
            tx.commit().await.map_err(&io)?;
            Ok::<_, Error>(claimed)
        })?;
        let mut epochs: std::collections::HashMap<String, u64> = claimed.into_iter().collect();
        let mut writer = self.writer()?;
        let mut out = Vec::with_capacity(epochs.len());
        for tree_id in trees {
            if let Some(epoch) = epochs.remove(tree_id.as_str()) {
                writer.claims.insert(Arc::from(tree_id.as_str()), epoch);
                out.push((tree_id.clone(), epoch));
            }
        }
        Ok(out)
    }

    fn resumes(
        &self,
        trees: &[TreeId],
    ) -> Result<Vec<Result<(TreeRecord, Recovery), Error>>, Error> {
        if trees.is_empty() {
            return Ok(Vec::new());
        }
        let tree_ids: Vec<&str> = trees.iter().map(TreeId::as_str).collect();
        let now = now_ms();
        let (rows, segments) = self.block(async {
            let io = self.io();
            let client = self.client().await?;
            let record = format!("{RECORD} WHERE t.tree_id = ANY($1)");
            let ids: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&tree_ids];
            let rows = client.query(&record, &ids);
            let segments = client.query(
                "SELECT tree_id, body FROM segments WHERE tree_id = ANY($1) ORDER BY tree_id, n",
                &ids,
            );
            let (rows, segments) = futures::try_join!(rows, segments).map_err(&io)?;
            Ok::<_, Error>((rows, segments))
        })?;
        let mut found: std::collections::HashMap<String, tokio_postgres::Row> = rows
            .into_iter()
            .map(|r| (r.get::<_, String>("tree_id"), r))
            .collect();
        let mut logs: std::collections::HashMap<String, Vec<Vec<u8>>> = Default::default();
        for r in segments {
            logs.entry(r.get(0)).or_default().push(r.get(1));
        }
        Ok(trees
            .iter()
            .map(|tree| {
                let tree_id = tree.as_str();
                let row = found
                    .remove(tree_id)
                    .ok_or_else(|| Error::UnknownTree(tree.clone()))?;
                let (record, _) = self.record_row(&row, now)?;
                let last_seq = row.get::<_, i64>("last_seq") as u64;
                let bodies = logs.remove(tree_id).unwrap_or_default().into_iter().map(Ok);
                let log = TreeLog::from_segments(tree_id, bodies, &self.bad(tree))?;
                Ok((record, log.recovery(tree_id, last_seq, &self.bad(tree))?))
            })
            .collect())
    }

    fn runs(&self, tree: &TreeId) -> Result<Vec<RunNode>, Error> {
        Ok(self.read_log(tree)?.nodes())
    }

    fn run(&self, run_id: &RunId) -> Result<StoredRun, Error> {
        let tree = run_id.tree();
        let log = match self.read_log(tree) {
            Err(Error::UnknownTree(_)) => return Err(Error::UnknownRun(run_id.clone())),
            other => other?,
        };
        log.stored_run(run_id, &self.bad(tree))
    }

    fn recovery(&self, tree: &TreeId) -> Result<Recovery, Error> {
        let tree_id = tree.as_str();
        let (log, last_seq) = self.block(async {
            let client = self.client().await?;
            let log = self.log(&**client, tree).await?;
            let last_seq: i64 = client
                .query_one("SELECT last_seq FROM trees WHERE tree_id = $1", &[&tree_id])
                .await
                .map_err(self.io())?
                .get(0);
            Ok::<_, Error>((log, last_seq as u64))
        })?;
        log.recovery(tree_id, last_seq, &self.bad(tree))
    }

    fn final_states(&self, tree: &TreeId) -> Result<Vec<AgentState>, Error> {
        self.read_log(tree)?.final_states(&self.bad(tree))
    }

    fn events(&self, tree: &TreeId, after: u64) -> Result<Vec<JournalEntry>, Error> {
        let tree_id = tree.as_str();
        // Only the segments with events past `after` (and those written
        // before segments kept their seqs): each holds whole events, with
        // what the journal adds to them (a reply's usage, a run's output).
        let rows = self.block(async {
            let io = self.io();
            let client = self.client().await?;
            let after = after as i64;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&tree_id, &after];
            let found = client.query_opt("SELECT 1 FROM trees WHERE tree_id = $1", &params[..1]);
            let segments = client.query(
                "SELECT body FROM segments
                 WHERE tree_id = $1 AND (last_seq IS NULL OR last_seq > $2) ORDER BY n",
                &params,
            );
            let (found, rows) = futures::try_join!(found, segments).map_err(&io)?;
            match found {
                Some(_) => Ok(rows),
                None => Err(Error::UnknownTree(tree.clone())),
            }
        })?;
        let bodies = rows.into_iter().map(|r| Ok(r.get::<_, Vec<u8>>(0)));
        TreeLog::from_segments(tree_id, bodies, &self.bad(tree))?.journal(after, &self.bad(tree))
    }

    fn export(&self, tree: &TreeId) -> Result<Value, Error> {
        let (record, summary) = self.tree(tree)?;
        self.read_log(tree)?
            .export(record, summary, &self.bad(tree))
    }

    fn gc(&self, cutoff_ms: u64) -> Result<GcReport, Error> {
        self.gc_here(cutoff_ms)
    }

    fn claim(&self, tree: &TreeId) -> Result<u64, Error> {
        let lease = self.lease_ms;
        self.take(tree, "", |status, owner, heartbeat| {
            crate::store::claimable(tree, (status, owner, heartbeat), now_ms(), lease)
        })
    }

    fn claim_turn(&self, tree: &TreeId) -> Result<u64, Error> {
        self.take(
            tree,
            "status = 'running', error = NULL, finished_ms = NULL, ",
            |status, _, _| crate::store::turn_claimable(tree, status),
        )
    }

    fn post_control(&self, tree: &TreeId, control: &Value) -> Result<u64, Error> {
        let tree_id = tree.as_str();
        let body = control.to_string();
        self.block(async {
            let io = self.io();
            let client = self.client().await?;
            // The insert and its wake-up in one statement (one transaction).
            let row = client
                .query_opt(
                    "WITH c AS (
                         INSERT INTO controls(tree_id, body, posted_ms)
                         SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM trees WHERE tree_id = $1)
                         RETURNING id
                     )
                     SELECT c.id, pg_notify('arbor_control', $1)::TEXT FROM c",
                    &[&tree_id, &body, &(now_ms() as i64)],
                )
                .await
                .map_err(&io)?
                .ok_or_else(|| Error::UnknownTree(tree.clone()))?;
            Ok(row.get::<_, i64>(0) as u64)
        })
    }

    fn take_controls(&self, trees: &[TreeId]) -> Result<Vec<Control>, Error> {
        if trees.is_empty() {
            return Ok(Vec::new());
        }
        let tree_ids: Vec<&str> = trees.iter().map(TreeId::as_str).collect();
        let rows = self.block(async {
            let client = self.client().await?;
            // Rows another taker holds are skipped, not waited for: each
            // control goes to one taker.
            client
                .query(
                    "DELETE FROM controls WHERE id IN (
                         SELECT id FROM controls WHERE tree_id = ANY($1)
                         ORDER BY id FOR UPDATE SKIP LOCKED
                     )
                     RETURNING id, tree_id, body",
                    &[&tree_ids],
                )
                .await
                .map_err(self.io())
        })?;
        let taken = rows.iter().map(|r| {
            (
                r.get::<_, i64>("id") as u64,
                r.get("tree_id"),
                r.get("body"),
            )
        });
        query::controls(taken, &self.shown)
    }

    fn fail_claimed(&self, tree: &TreeId, epoch: u64, reason: &str) -> Result<(), Error> {
        let tree_id = tree.as_str();
        self.block(async {
            let client = self.client().await?;
            client
                .execute(
                    "UPDATE trees SET status = 'failed', error = $3, finished_ms = $4,
                         owner = '-:released', heartbeat_ms = 0
                     WHERE tree_id = $1 AND epoch = $2 AND status = 'running'",
                    &[&tree_id, &(epoch as i64), &reason, &(now_ms() as i64)],
                )
                .await
                .map_err(self.io())
        })?;
        Ok(())
    }

    fn cancel_claimed(&self, tree: &TreeId, epoch: u64, reason: &str) -> Result<(), Error> {
        let tree_id = tree.as_str();
        self.block(async {
            let client = self.client().await?;
            client
                .execute(
                    "UPDATE trees SET status = 'cancelled', error = $3, finished_ms = $4,
                         owner = '-:released', heartbeat_ms = 0
                     WHERE tree_id = $1 AND epoch = $2 AND status = 'running'",
                    &[&tree_id, &(epoch as i64), &reason, &(now_ms() as i64)],
                )
                .await
                .map_err(self.io())
        })?;
        Ok(())
    }

    fn queue_turn(
        &self,
        tree_id: &TreeId,
        prompt: &str,
        params: Option<&Value>,
        webhook: Option<&str>,
        limit: usize,
    ) -> Result<QueuedTurn, Error> {
        self.queue_turn_here(tree_id, prompt, params, webhook, limit)
    }

    fn queued_turns(&self, tree_id: &TreeId) -> Result<Vec<QueuedTurn>, Error> {
        self.queued_turns_here(tree_id)
    }

    fn take_turn(
        &self,
        tree_id: &TreeId,
        only: Option<u64>,
    ) -> Result<Option<(QueuedTurn, u64)>, Error> {
        self.take_turn_here(tree_id, only)
    }

    fn forget_turn(&self, id: u64) -> Result<(), Error> {
        self.forget_turn_here(id)
    }

    fn trees_with_queued_turns(&self, limit: usize) -> Result<Vec<TreeId>, Error> {
        crate::store::tree_ids(self.trees_with_queued_turns_here(limit)?)
    }

    fn owner(&self, tree: &TreeId) -> Result<Option<Owner>, Error> {
        let tree_id = tree.as_str();
        let row = self.block(async {
            let client = self.client().await?;
            client
                .query_opt(
                    "SELECT status, owner, heartbeat_ms, epoch FROM trees WHERE tree_id = $1",
                    &[&tree_id],
                )
                .await
                .map_err(self.io())
        })?;
        let row = row.ok_or_else(|| Error::UnknownTree(tree.clone()))?;
        let status = status_of(&row, "status").map_err(|e| self.bad(tree)(e.to_string()))?;
        let owner = Owner {
            owner: row.get("owner"),
            heartbeat_ms: row.get::<_, i64>("heartbeat_ms") as u64,
            epoch: row.get::<_, i64>("epoch") as u64,
        };
        let running = status == TreeStatus::Running
            && crate::store::still_running_within(
                &owner.owner,
                owner.heartbeat_ms,
                now_ms(),
                self.lease_ms,
            );
        Ok(running.then_some(owner))
    }

    fn subscribe(&self) -> Result<Option<std::sync::mpsc::Receiver<Wake>>, Error> {
        self.listen().map(Some)
    }

    fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    fn dump(&self, tree: &TreeId) -> Result<TreeDump, Error> {
        let tree_id = tree.as_str();
        let (row, config, segments) = self.block(async {
            let io = self.io();
            let mut client = self.client().await?;
            // One snapshot of the row and its log.
            let tx = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(&io)?;
            let row = tx
                .query_opt(&Dialect::Postgres.tree_row(), &[&tree_id])
                .await
                .map_err(&io)?
                .ok_or_else(|| Error::UnknownTree(tree.clone()))?;
            let config: Option<String> = tx
                .query_opt(
                    "SELECT c.text FROM trees t JOIN configs c ON c.hash = t.config
                     WHERE t.tree_id = $1",
                    &[&tree_id],
                )
                .await
                .map_err(&io)?
                .map(|r| r.get(0));
            let segments: Vec<Segment> = tx
                .query(
                    "SELECT n, body FROM segments WHERE tree_id = $1 ORDER BY n",
                    &[&tree_id],
                )
                .await
                .map_err(&io)?
                .iter()
                .map(|r| Segment {
                    n: r.get::<_, i64>(0) as u64,
                    body: r.get(1),
                })
                .collect();
            tx.commit().await.map_err(&io)?;
            Ok::<_, Error>((row, config, segments))
        })?;
        let u = |c: &str| row.get::<_, i64>(c) as u64;
        let row = TreeRow {
            tree_id: row.get("tree_id"),
            root_run_id: row.get("root_run_id"),
            agent: row.get("agent"),
            prompt: row.get("prompt"),
            params: row.get("params"),
            model: row.get("model"),
            limits: row.get("limits"),
            origin: row.get("origin"),
            history: row.get("history"),
            status: status_of(&row, "status").map_err(|e| self.bad(tree)(e.to_string()))?,
            error: row.get("error"),
            started_ms: u("started_ms"),
            finished_ms: row.get::<_, Option<i64>>("finished_ms").map(|v| v as u64),
            heartbeat_ms: u("heartbeat_ms"),
            owner: row.get("owner"),
            last_seq: u("last_seq"),
            next_id: u("next_id"),
            segments: u("segments"),
            resumes: u("resumes"),
            agents: u("agents"),
            input_tokens: u("input_tokens"),
            output_tokens: u("output_tokens"),
            cost: row.get("cost"),
            epoch: u("epoch"),
            principal: row.get("principal"),
        };
        Ok(TreeDump {
            row,
            config,
            segments,
        })
    }

    fn load(&self, dump: &TreeDump) -> Result<(), Error> {
        let r = &dump.row;
        let hash = dump
            .config
            .as_deref()
            .map(crate::store::encode::config_hash);
        self.block(async {
            let io = self.io();
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(&io)?;
            if let (Some(hash), Some(text)) = (&hash, &dump.config) {
                tx.execute(
                    "INSERT INTO configs(hash, text) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                    &[hash, text],
                )
                .await
                .map_err(&io)?;
            }
            let i = |v: u64| v as i64;
            let inserted = tx
                .execute(
                    &Dialect::Postgres.load_tree_row(),
                    &[
                        &r.tree_id,
                        &r.root_run_id,
                        &r.agent,
                        &r.prompt,
                        &r.params,
                        &r.model,
                        &r.limits,
                        &r.origin,
                        &r.history,
                        &r.status.as_str(),
                        &r.error,
                        &i(r.started_ms),
                        &r.finished_ms.map(i),
                        &i(r.heartbeat_ms),
                        &r.owner,
                        &i(r.last_seq),
                        &i(r.next_id),
                        &i(r.segments),
                        &i(r.resumes),
                        &i(r.agents),
                        &i(r.input_tokens),
                        &i(r.output_tokens),
                        &r.cost,
                        &i(r.epoch),
                        &r.principal,
                        &hash,
                    ],
                )
                .await
                .map_err(&io)?;
            if inserted == 0 {
                return Err(crate::store::already_stored(&r.tree_id));
            }
            let ns: Vec<i64> = dump.segments.iter().map(|s| s.n as i64).collect();
            let bodies: Vec<&[u8]> = dump.segments.iter().map(|s| &s.body[..]).collect();
            tx.execute(
                "INSERT INTO segments(tree_id, n, body)
                 SELECT $1, s.n, s.body FROM unnest($2::BIGINT[], $3::BYTEA[]) AS s(n, body)",
                &[&r.tree_id, &ns, &bodies],
            )
            .await
            .map_err(&io)?;
            tx.commit().await.map_err(&io)?;
            Ok(())
        })
    }
}

impl PgStore {
    /// Trees, newest first: every tree, or only `principal`'s.
    fn list(
        &self,
        filter: &TreeFilter,
        principal: Option<&str>,
    ) -> Result<Vec<TreeSummary>, Error> {
        let now = now_ms();
        let listing = Listing::new(filter);
        let stored = listing.stored.map(TreeStatus::as_str);
        let rows = self.block(async {
            let client = self.client().await?;
            client
                .query(
                    &listing.query(SUMMARY, Dialect::Postgres, principal.is_some()),
                    &[&stored, &(listing.sql_offset as i64), &principal],
                )
                .await
                .map_err(self.io())
        })?;
        listing.page(rows.iter().map(|row| self.summary_row(row, now)))
    }
}

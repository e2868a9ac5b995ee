//! The `Store` port over the file: listing and reading trees, claiming one
//! (fencing's epochs), and collecting old ones.

use arbor_actors::{AgentState, RunId, TreeId};
use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use super::{SqliteStore, sql};
use crate::error::Error;
use crate::recovery::Recovery;
use crate::store::log::TreeLog;
use crate::store::query::{self, Dialect, Listing, RecordTexts, SUMMARY};
use crate::store::{
    Control, Fenced, GcReport, JournalEntry, Owner, QueuedTurn, RunNode, Segment, Store, StoredRun,
    TreeDump, TreeFilter, TreeRecord, TreeRow, TreeStatus, TreeSummary, Write,
};
use crate::tree::now_ms;

/// `SUMMARY` without the principal, for a store older than principals.
const SUMMARY_BEFORE_PRINCIPALS: &str = "SELECT tree_id, root_run_id, agent, prompt, status,
        error, agents, input_tokens, output_tokens, cost, started_ms, finished_ms, heartbeat_ms,
        resumes, owner
    FROM trees";

/// The first schema version with `trees.principal`.
const PRINCIPAL_VERSION: i64 = 7;

/// The summary query for a store of the connection's schema version: with
/// the principal, or (an older store, read as it is) without, read as `None`.
fn summary_query(conn: &rusqlite::Connection) -> rusqlite::Result<&'static str> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    Ok(if version >= PRINCIPAL_VERSION {
        SUMMARY
    } else {
        SUMMARY_BEFORE_PRINCIPALS
    })
}

fn summary_row(r: &rusqlite::Row<'_>, now: u64) -> rusqlite::Result<TreeSummary> {
    let mut status: TreeStatus = r.get(4)?;
    let heartbeat: i64 = r.get(12)?;
    let owner: String = r.get(14)?;
    if status == TreeStatus::Running && !crate::store::still_running(&owner, heartbeat as u64, now)
    {
        status = TreeStatus::Interrupted;
    }
    /// An id column, read as text and typed.
    fn id<T: std::str::FromStr<Err = arbor_actors::IdError>>(
        r: &rusqlite::Row<'_>,
        column: usize,
    ) -> rusqlite::Result<T> {
        let text: String = r.get(column)?;
        text.parse().map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(
                column,
                rusqlite::types::Type::Text,
                Box::new(e),
            )
        })
    }
    Ok(TreeSummary {
        tree_id: id(r, 0)?,
        root_run_id: id(r, 1)?,
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
        principal: if r.as_ref().column_count() > 15 {
            r.get(15)?
        } else {
            None
        },
    })
}

/// Stored as its name; a name no build wrote is an error naming the column.
impl rusqlite::types::FromSql for TreeStatus {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        value
            .as_str()?
            .parse()
            .map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
    }
}

impl rusqlite::types::ToSql for TreeStatus {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(self.as_str().into())
    }
}

impl Store for SqliteStore {
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
        let conn = self.conn()?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(sql(&self.path))?;
        let column = if version >= PRINCIPAL_VERSION {
            "principal"
        } else {
            "NULL"
        };
        conn.prepare_cached(&format!("SELECT {column} FROM trees WHERE tree_id = ?1"))
            .and_then(|mut stmt| stmt.query_row([tree_id], |r| r.get(0)).optional())
            .map_err(sql(&self.path))?
            .ok_or_else(|| Error::UnknownTree(tree.clone()))
    }

    fn tree(&self, tree: &TreeId) -> Result<(TreeRecord, TreeSummary), Error> {
        let tree_id = tree.as_str();
        let conn = self.conn()?;
        let now = now_ms();
        let summary_sql = summary_query(&conn).map_err(sql(&self.path))?;
        let summary = conn
            .query_row(
                &format!("{summary_sql} WHERE tree_id = ?1"),
                [tree_id],
                |r| summary_row(r, now),
            )
            .optional()
            .map_err(sql(&self.path))?
            .ok_or_else(|| Error::UnknownTree(tree.clone()))?;
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
        let record = RecordTexts {
            params: params_json,
            model,
            limits: limits_json,
            origin,
            history: history_json,
            config,
        }
        .record(&summary, &self.bad(tree))?;
        Ok((record, summary))
    }

    fn status(&self, tree: &TreeId) -> Result<TreeStatus, Error> {
        let tree_id = tree.as_str();
        let conn = self.conn()?;
        let now = now_ms();
        let summary = conn
            .prepare_cached(&format!("{SUMMARY_BEFORE_PRINCIPALS} WHERE tree_id = ?1"))
            .and_then(|mut stmt| {
                stmt.query_row([tree_id], |r| summary_row(r, now))
                    .optional()
            })
            .map_err(sql(&self.path))?
            .ok_or_else(|| Error::UnknownTree(tree.clone()))?;
        Ok(summary.status)
    }

    fn runs(&self, tree: &TreeId) -> Result<Vec<RunNode>, Error> {
        let conn = self.conn()?;
        Ok(self.log(&conn, tree)?.nodes())
    }

    fn run(&self, run_id: &RunId) -> Result<StoredRun, Error> {
        let conn = self.conn()?;
        let tree = run_id.tree();
        let log = match self.log(&conn, tree) {
            Err(Error::UnknownTree(_)) => return Err(Error::UnknownRun(run_id.clone())),
            other => other?,
        };
        log.stored_run(run_id, &self.bad(tree))
    }

    fn recovery(&self, tree: &TreeId) -> Result<Recovery, Error> {
        let tree_id = tree.as_str();
        let conn = self.conn()?;
        let log = self.log(&conn, tree)?;
        let last_seq = conn
            .query_row(
                "SELECT last_seq FROM trees WHERE tree_id = ?1",
                [tree_id],
                |r| r.get::<_, i64>(0),
            )
            .map_err(sql(&self.path))? as u64;
        log.recovery(tree_id, last_seq, &self.bad(tree))
    }

    fn final_states(&self, tree: &TreeId) -> Result<Vec<AgentState>, Error> {
        let conn = self.conn()?;
        self.log(&conn, tree)?.final_states(&self.bad(tree))
    }

    fn events(&self, tree: &TreeId, after: u64) -> Result<Vec<JournalEntry>, Error> {
        let tree_id = tree.as_str();
        let conn = self.conn()?;
        // A store of an older schema (read as it is) has no segment seqs.
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(sql(&self.path))?;
        if version < 5 {
            return self.log(&conn, tree)?.journal(after, &self.bad(tree));
        }
        self.known(&conn, tree)?;
        // Only the segments with events past `after` (and those written
        // before segments kept their seqs): each holds whole events, with
        // what the journal adds to them (a reply's usage, a run's output).
        let mut stmt = conn
            .prepare_cached(
                "SELECT body FROM segments
                 WHERE tree_id = ?1 AND (last_seq IS NULL OR last_seq > ?2) ORDER BY n",
            )
            .map_err(sql(&self.path))?;
        let bodies = stmt
            .query_map(params![tree_id, after as i64], |r| r.get::<_, Vec<u8>>(0))
            .map_err(sql(&self.path))?
            .map(|body| body.map_err(sql(&self.path)));
        TreeLog::from_segments(tree_id, bodies, &self.bad(tree))?.journal(after, &self.bad(tree))
    }

    fn export(&self, tree: &TreeId) -> Result<Value, Error> {
        let (record, summary) = self.tree(tree)?;
        let conn = self.conn()?;
        self.log(&conn, tree)?
            .export(record, summary, &self.bad(tree))
    }

    fn claim(&self, tree: &TreeId) -> Result<u64, Error> {
        // The next epoch, in the transaction that takes the tree: whoever
        // held it before writes nothing more of it.
        self.take(tree, "", |status, owner, heartbeat| {
            let row = (status, owner, heartbeat);
            crate::store::claimable(tree, row, now_ms(), self.lease_ms())
        })
    }

    fn claim_turn(&self, tree: &TreeId) -> Result<u64, Error> {
        // Running again, in the transaction that takes it: of two processes
        // starting a turn of one tree, one gets it.
        self.take(
            tree,
            "status = 'running', error = NULL, finished_ms = NULL, ",
            |status, _, _| crate::store::turn_claimable(tree, status),
        )
    }

    fn post_control(&self, tree: &TreeId, control: &Value) -> Result<u64, Error> {
        let tree_id = tree.as_str();
        let conn = self.conn()?;
        let id: Option<i64> = conn
            .query_row(
                "INSERT INTO controls(tree_id, body, posted_ms)
                 SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM trees WHERE tree_id = ?1)
                 RETURNING id",
                params![tree_id, control.to_string(), now_ms() as i64],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql(&self.path))?;
        id.map(|id| id as u64)
            .ok_or_else(|| Error::UnknownTree(tree.clone()))
    }

    fn take_controls(&self, tree_ids: &[TreeId]) -> Result<Vec<Control>, Error> {
        let mut conn = self.conn()?;
        // Under the write lock: of two takers, the second finds them gone.
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql(&self.path))?;
        let mut taken = Vec::new();
        {
            let mut stmt = tx
                .prepare_cached("DELETE FROM controls WHERE tree_id = ?1 RETURNING id, body")
                .map_err(sql(&self.path))?;
            for tree in tree_ids {
                let rows = stmt
                    .query_map([tree.as_str()], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                    })
                    .map_err(sql(&self.path))?;
                for row in rows {
                    let (id, body) = row.map_err(sql(&self.path))?;
                    taken.push((id as u64, tree.to_string(), body));
                }
            }
        }
        tx.commit().map_err(sql(&self.path))?;
        query::controls(taken, &self.path.display().to_string())
    }

    fn fail_claimed(&self, tree: &TreeId, epoch: u64, reason: &str) -> Result<(), Error> {
        let tree_id = tree.as_str();
        let conn = self.conn()?;
        conn.execute(
            "UPDATE trees SET status = 'failed', error = ?3, finished_ms = ?4,
                 owner = '-:released', heartbeat_ms = 0
             WHERE tree_id = ?1 AND epoch = ?2 AND status = 'running'",
            params![tree_id, epoch as i64, reason, now_ms() as i64],
        )
        .map_err(sql(&self.path))?;
        Ok(())
    }

    fn cancel_claimed(&self, tree: &TreeId, epoch: u64, reason: &str) -> Result<(), Error> {
        let tree_id = tree.as_str();
        let conn = self.conn()?;
        conn.execute(
            "UPDATE trees SET status = 'cancelled', error = ?3, finished_ms = ?4,
                 owner = '-:released', heartbeat_ms = 0
             WHERE tree_id = ?1 AND epoch = ?2 AND status = 'running'",
            params![tree_id, epoch as i64, reason, now_ms() as i64],
        )
        .map_err(sql(&self.path))?;
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
        let conn = self.conn()?;
        let row: Option<(TreeStatus, String, i64, i64)> = conn
            .query_row(
                "SELECT status, owner, heartbeat_ms, epoch FROM trees WHERE tree_id = ?1",
                [tree_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(sql(&self.path))?;
        let (status, owner, heartbeat, epoch) =
            row.ok_or_else(|| Error::UnknownTree(tree.clone()))?;
        let running = status == TreeStatus::Running
            && crate::store::still_running(&owner, heartbeat as u64, now_ms());
        Ok(running.then_some(Owner {
            owner,
            heartbeat_ms: heartbeat as u64,
            epoch: epoch as u64,
        }))
    }

    fn dump(&self, tree: &TreeId) -> Result<TreeDump, Error> {
        let tree_id = tree.as_str();
        let mut conn = self.conn()?;
        // One snapshot of the row and its log.
        let tx = conn.transaction().map_err(sql(&self.path))?;
        let u = |v: i64| v as u64;
        let row = tx
            .query_row(&Dialect::Sqlite.tree_row(), [tree_id], |r| {
                Ok(TreeRow {
                    tree_id: r.get("tree_id")?,
                    root_run_id: r.get("root_run_id")?,
                    agent: r.get("agent")?,
                    prompt: r.get("prompt")?,
                    params: r.get("params")?,
                    model: r.get("model")?,
                    limits: r.get("limits")?,
                    origin: r.get("origin")?,
                    history: r.get("history")?,
                    status: r.get("status")?,
                    error: r.get("error")?,
                    started_ms: u(r.get("started_ms")?),
                    finished_ms: r.get::<_, Option<i64>>("finished_ms")?.map(u),
                    heartbeat_ms: u(r.get("heartbeat_ms")?),
                    owner: r.get("owner")?,
                    last_seq: u(r.get("last_seq")?),
                    next_id: u(r.get("next_id")?),
                    segments: u(r.get("segments")?),
                    resumes: u(r.get("resumes")?),
                    agents: u(r.get("agents")?),
                    input_tokens: u(r.get("input_tokens")?),
                    output_tokens: u(r.get("output_tokens")?),
                    cost: r.get("cost")?,
                    epoch: u(r.get("epoch")?),
                    principal: r.get("principal")?,
                })
            })
            .optional()
            .map_err(sql(&self.path))?
            .ok_or_else(|| Error::UnknownTree(tree.clone()))?;
        let config: Option<String> = tx
            .query_row(
                "SELECT c.text FROM trees t JOIN configs c ON c.hash = t.config
                 WHERE t.tree_id = ?1",
                [tree_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql(&self.path))?;
        let segments = {
            let mut stmt = tx
                .prepare("SELECT n, body FROM segments WHERE tree_id = ?1 ORDER BY n")
                .map_err(sql(&self.path))?;
            stmt.query_map([tree_id], |r| {
                Ok(Segment {
                    n: u(r.get(0)?),
                    body: r.get(1)?,
                })
            })
            .map_err(sql(&self.path))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql(&self.path))?
        };
        tx.commit().map_err(sql(&self.path))?;
        Ok(TreeDump {
            row,
            config,
            segments,
        })
    }

    fn load(&self, dump: &TreeDump) -> Result<(), Error> {
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql(&self.path))?;
        let r = &dump.row;
        let hash = dump
            .config
            .as_deref()
            .map(crate::store::encode::config_hash);
        if let (Some(hash), Some(text)) = (&hash, &dump.config) {
            tx.execute(
                "INSERT OR IGNORE INTO configs(hash, text) VALUES (?1, ?2)",
                params![hash, text],
            )
            .map_err(sql(&self.path))?;
        }
        let i = |v: u64| v as i64;
        let inserted = tx
            .execute(
                &Dialect::Sqlite.load_tree_row(),
                params![
                    r.tree_id,
                    r.root_run_id,
                    r.agent,
                    r.prompt,
                    r.params,
                    r.model,
                    r.limits,
                    r.origin,
                    r.history,
                    r.status,
                    r.error,
                    i(r.started_ms),
                    r.finished_ms.map(i),
                    i(r.heartbeat_ms),
                    r.owner,
                    i(r.last_seq),
                    i(r.next_id),
                    i(r.segments),
                    i(r.resumes),
                    i(r.agents),
                    i(r.input_tokens),
                    i(r.output_tokens),
                    r.cost,
                    i(r.epoch),
                    r.principal,
                    hash,
                ],
            )
            .map_err(sql(&self.path))?;
        if inserted == 0 {
            return Err(crate::store::already_stored(&r.tree_id));
        }
        {
            let mut stmt = tx
                .prepare("INSERT INTO segments(tree_id, n, body) VALUES (?1, ?2, ?3)")
                .map_err(sql(&self.path))?;
            for s in &dump.segments {
                stmt.execute(params![r.tree_id, i(s.n), s.body])
                    .map_err(sql(&self.path))?;
            }
        }
        tx.commit().map_err(sql(&self.path))?;
        Ok(())
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
            tx.execute("DELETE FROM controls WHERE tree_id = ?1", [tree])
                .map_err(sql(&self.path))?;
            tx.execute("DELETE FROM queued_turns WHERE tree_id = ?1", [tree])
                .map_err(sql(&self.path))?;
            tx.execute("DELETE FROM webhooks WHERE tree_id = ?1", [tree])
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

impl SqliteStore {
    /// Takes the tree `tree_id` for this process under the next epoch, in one
    /// immediate transaction (of two processes taking one tree, one gets it):
    /// `check` may refuse it on its status, owner and heartbeat; `also` is
    /// more of the `UPDATE`'s assignments (each followed by `, `). Records the
    /// claim's epoch and returns it.
    fn take(
        &self,
        tree: &TreeId,
        also: &str,
        check: impl FnOnce(TreeStatus, &str, u64) -> Result<(), Error>,
    ) -> Result<u64, Error> {
        let tree_id = tree.as_str();
        let mut conn = self.conn()?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql(&self.path))?;
        let row: Option<(TreeStatus, String, i64)> = tx
            .query_row(
                "SELECT status, owner, heartbeat_ms FROM trees WHERE tree_id = ?1",
                [tree_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(sql(&self.path))?;
        let (status, owner, heartbeat) = row.ok_or_else(|| Error::UnknownTree(tree.clone()))?;
        check(status, &owner, heartbeat as u64)?;
        let epoch: i64 = tx
            .query_row(
                &format!(
                    "UPDATE trees SET {also}owner = ?2, heartbeat_ms = ?3, epoch = epoch + 1
                     WHERE tree_id = ?1 RETURNING epoch"
                ),
                params![tree_id, crate::store::owner_id(), now_ms() as i64],
                |r| r.get(0),
            )
            .map_err(sql(&self.path))?;
        tx.commit().map_err(sql(&self.path))?;
        self.hold(tree_id, epoch as u64)?;
        Ok(epoch as u64)
    }
}

impl SqliteStore {
    /// Reads every segment of a tree.
    pub(super) fn log(&self, conn: &rusqlite::Connection, tree: &TreeId) -> Result<TreeLog, Error> {
        self.known(conn, tree)?;
        let tree_id = tree.as_str();
        let mut stmt = conn
            .prepare_cached("SELECT body FROM segments WHERE tree_id = ?1 ORDER BY n")
            .map_err(sql(&self.path))?;
        let bodies = stmt
            .query_map([tree_id], |r| r.get::<_, Vec<u8>>(0))
            .map_err(sql(&self.path))?
            .map(|body| body.map_err(sql(&self.path)));
        TreeLog::from_segments(tree_id, bodies, &self.bad(tree))
    }

    /// `Error::UnknownTree` unless the store has the tree.
    fn known(&self, conn: &rusqlite::Connection, tree: &TreeId) -> Result<(), Error> {
        let tree_id = tree.as_str();
        let found: Option<i64> = conn
            .query_row("SELECT 1 FROM trees WHERE tree_id = ?1", [tree_id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql(&self.path))?;
        match found {
            Some(_) => Ok(()),
            None => Err(Error::UnknownTree(tree.clone())),
        }
    }

    pub(super) fn bad(&self, tree: &TreeId) -> impl Fn(String) -> Error + use<> {
        let path = self.path.display().to_string();
        let tree_id = tree.clone();
        move |reason| Error::StoreCorrupt {
            path: path.clone(),
            tree: tree_id.clone(),
            reason,
        }
    }
}

impl SqliteStore {
    /// Trees, newest first: every tree, or only `principal`'s.
    fn list(
        &self,
        filter: &TreeFilter,
        principal: Option<&str>,
    ) -> Result<Vec<TreeSummary>, Error> {
        let conn = self.conn()?;
        let now = now_ms();
        let summary = summary_query(&conn).map_err(sql(&self.path))?;
        if principal.is_some() && summary == SUMMARY_BEFORE_PRINCIPALS {
            // A store older than principals: no tree has one.
            return Ok(Vec::new());
        }
        let listing = Listing::new(filter);
        let mut stmt = conn
            .prepare(&listing.query(summary, Dialect::Sqlite, principal.is_some()))
            .map_err(sql(&self.path))?;
        let rows = stmt
            .query_map(
                params![listing.stored, listing.sql_offset as i64, principal],
                |r| summary_row(r, now),
            )
            .map_err(sql(&self.path))?;
        listing.page(rows).map_err(sql(&self.path))
    }
}

//! The write path on Postgres: a batch is one transaction that first locks
//! the rows of every tree it touches (`SELECT … FOR UPDATE`, in tree order,
//! one round trip), so no claim can move a tree's epoch while the batch
//! decides; then the tree records, heartbeats and releases; then every
//! segment in one multi-row insert and every row update in one statement,
//! each naming the epoch this process holds (a stale one matches nothing),
//! and the wake-ups (`NOTIFY arbor_journal`, delivered at commit), sent
//! together in one pipeline.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::PgStore;
use crate::error::Error;
use crate::store::encode::{EncodeError, Encoder, Rows, WriterState, config_hash};
use crate::store::query::{self, Retry};
use crate::store::{Fenced, Write};
use crate::tree::now_ms;

/// Batches tried again after a deadlock or a serialization failure (the
/// database aborted the transaction, nothing of it applied).
const RETRIES: u32 = 3;

/// Why a batch failed.
#[derive(Debug)]
pub(super) enum BatchError {
    Db(tokio_postgres::Error),
    Encode(EncodeError),
    /// No connection could be had.
    Store(Error),
}

impl From<EncodeError> for BatchError {
    fn from(e: EncodeError) -> Self {
        BatchError::Encode(e)
    }
}

impl From<tokio_postgres::Error> for BatchError {
    fn from(e: tokio_postgres::Error) -> Self {
        BatchError::Db(e)
    }
}

/// A tree's row as the batch locked it.
#[derive(Clone)]
struct Row {
    epoch: u64,
    owner: String,
    root_run_id: String,
    next_id: u64,
    segments: u64,
    last_seq: u64,
}

/// The rows a batch locked, answering the encoder's lookups.
#[derive(Default)]
struct Locked(HashMap<String, Row>);

impl Rows for Locked {
    type Error = BatchError;

    fn claim_of(&mut self, tree_id: &str) -> Result<Option<(u64, String)>, BatchError> {
        Ok(self.0.get(tree_id).map(|r| (r.epoch, r.owner.clone())))
    }

    fn log_of(&mut self, tree_id: &str) -> Result<Option<(String, u64, u64)>, BatchError> {
        Ok(self
            .0
            .get(tree_id)
            .map(|r| (r.root_run_id.clone(), r.next_id, r.segments)))
    }

    fn last_seq_of(&mut self, tree_id: &str) -> Result<u64, BatchError> {
        Ok(self.0.get(tree_id).map_or(0, |r| r.last_seq))
    }
}

fn row(r: &tokio_postgres::Row) -> Row {
    Row {
        epoch: r.get::<_, i64>("epoch") as u64,
        owner: r.get("owner"),
        root_run_id: r.get("root_run_id"),
        next_id: r.get::<_, i64>("next_id") as u64,
        segments: r.get::<_, i64>("segments") as u64,
        last_seq: r.get::<_, i64>("last_seq") as u64,
    }
}

const LOCK: &str =
    "SELECT tree_id, epoch, owner, root_run_id, next_id, segments, last_seq FROM trees
     WHERE tree_id = ANY($1) ORDER BY tree_id FOR UPDATE";

const UPSERT: &str = "INSERT INTO trees(tree_id, root_run_id, agent, prompt, params, model,
         limits, origin, history, status, started_ms, heartbeat_ms, owner, epoch, config,
         principal)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'running', $10, $11, $12, 1, $14, $15)
     ON CONFLICT(tree_id) DO UPDATE SET status = 'running', error = NULL,
         root_run_id = excluded.root_run_id, prompt = excluded.prompt,
         params = excluded.params, history = excluded.history,
         finished_ms = NULL, heartbeat_ms = excluded.heartbeat_ms,
         owner = excluded.owner,
         resumes = trees.resumes
             + CASE WHEN trees.root_run_id = excluded.root_run_id THEN 1 ELSE 0 END,
         config = COALESCE(excluded.config, trees.config)
     WHERE trees.epoch = $13
     RETURNING epoch, owner, root_run_id, next_id, segments, last_seq";

/// Segments go in only for trees whose row still has the epoch this process
/// holds (or that it writes without a claim: `NULL`).
const SEGMENTS: &str = "INSERT INTO segments(tree_id, n, body, last_seq)
     SELECT s.tree_id, s.n, s.body, s.last_seq
     FROM unnest($1::TEXT[], $2::BIGINT[], $3::BYTEA[], $4::BIGINT[], $5::BIGINT[])
         AS s(tree_id, n, body, epoch, last_seq)
     WHERE s.epoch IS NULL
        OR EXISTS (SELECT 1 FROM trees t WHERE t.tree_id = s.tree_id AND t.epoch = s.epoch)";

/// Every row update of the batch in one statement; a released tree keeps no
/// heartbeat (it stays interrupted for the next process to resume at once).
const UPDATE: &str = "UPDATE trees SET last_seq = GREATEST(trees.last_seq, d.last_seq),
         heartbeat_ms = CASE WHEN trees.owner = '-:released' THEN 0 ELSE $10::BIGINT END,
         next_id = d.next_id, segments = d.segments, agents = trees.agents + d.agents,
         input_tokens = trees.input_tokens + d.input_tokens,
         output_tokens = trees.output_tokens + d.output_tokens, cost = trees.cost + d.cost,
         status = COALESCE(d.status, trees.status),
         error = CASE WHEN d.status IS NULL THEN trees.error ELSE d.error END,
         finished_ms = COALESCE(d.finished_ms, trees.finished_ms)
     FROM unnest($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::BIGINT[], $5::BIGINT[],
                 $6::BIGINT[], $7::BIGINT[], $8::DOUBLE PRECISION[], $9::BIGINT[],
                 $11::TEXT[], $12::TEXT[], $13::BIGINT[])
         AS d(tree_id, last_seq, next_id, segments, agents, input_tokens, output_tokens, cost,
              epoch, status, error, finished_ms)
     WHERE trees.tree_id = d.tree_id AND (d.epoch IS NULL OR trees.epoch = d.epoch)";

const NOTIFY: &str = "SELECT pg_notify('arbor_journal', p)::TEXT FROM unnest($1::TEXT[]) AS p";

/// The trees a batch touches.
fn touched(batch: &[Write]) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut add = |id: &str| {
        if !seen.contains(id) {
            seen.insert(id.to_owned());
        }
    };
    for write in batch {
        match write {
            Write::Tree(t) => add(&t.tree_id),
            Write::Event(e) => add(&e.tree_id),
            Write::Heartbeat(trees) | Write::Release(trees) => trees.iter().for_each(|t| add(t)),
            Write::Known { tree_id, .. } => add(tree_id),
        }
    }
    let mut ids: Vec<String> = seen.into_iter().collect();
    ids.sort();
    ids
}

impl PgStore {
    /// `Store::write`: the batch in one transaction.
    pub(super) fn write_batch(&self, batch: &[Write]) -> Result<Vec<Fenced>, Error> {
        let mut state = self.writer()?;
        query::write_batch(
            &mut state,
            |state| self.block(attempt(self, state, batch)),
            |e, tries| {
                // No connection, or it was lost (a restart, a terminated
                // backend): the writer keeps the batch and tries it again
                // once the database answers. The epoch fence and the
                // encoder's re-read of the locked rows make that safe (see
                // `lost`).
                let reason = match &e {
                    BatchError::Store(Error::StoreOpen { reason, .. }) => Some(reason.clone()),
                    BatchError::Db(db) if lost(db) => Some(self.describe(db)),
                    _ => None,
                };
                if let Some(reason) = reason {
                    return Retry::Fail(Error::StoreUnavailable {
                        path: self.shown.clone(),
                        reason,
                        disk_full: false,
                    });
                }
                let again = matches!(&e, BatchError::Db(db) if retryable(db));
                if !again || tries >= RETRIES {
                    let source: Box<dyn std::error::Error + Send + Sync> = match e {
                        BatchError::Db(e) => self.describe(&e).into(),
                        BatchError::Encode(e) => Box::new(e),
                        BatchError::Store(e) => Box::new(e),
                    };
                    return Retry::Fail(Error::StoreWrite {
                        path: self.shown.clone().into(),
                        source,
                    });
                }
                Retry::Again(std::time::Duration::ZERO)
            },
        )
    }
}

/// The connection is gone or the server is going away: closed, an I/O
/// error, SQLSTATE class 08 (connection exception), 57P01–57P03
/// (terminated by an administrator, crash shutdown, cannot connect now)
/// or 53300 (too many connections). Whatever the batch had done was rolled
/// back with its transaction, unless the commit itself was what went
/// unanswered: then the rows the retry locks show the batch's segments
/// and `last_seq` already there, and the encoder writes only what is new.
pub(super) fn lost(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(c) => {
            c.code().starts_with("08")
                || *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || *c == SqlState::TOO_MANY_CONNECTIONS
        }
        // No SQLSTATE: the error is the connection's (I/O, a protocol
        // error), not one the server sent about the statement.
        None => e.as_db_error().is_none(),
    }
}

/// A deadlock or serialization failure: the database gave up the
/// transaction, and the same batch may well go through now.
fn retryable(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    )
}

async fn attempt(
    store: &PgStore,
    state: &mut WriterState,
    batch: &[Write],
) -> Result<Vec<Fenced>, BatchError> {
    let mut client = store.client().await.map_err(BatchError::Store)?;
    let tx = client.transaction().await?;
    let ids = touched(batch);
    let mut rows = Locked::default();
    let lock = tx.prepare_cached(LOCK).await?;
    for r in tx.query(&lock, &[&ids]).await? {
        rows.0.insert(r.get("tree_id"), row(&r));
    }
    let owner = crate::store::owner_id();
    let mut b = Encoder::new(state);
    for write in batch {
        match write {
            Write::Tree(tree) => {
                // As on SQLite: a new tree takes epoch 1; a resumed one takes
                // its row up only if its claim still stands.
                let holding = b.holding(&tree.tree_id);
                let config = match &tree.config {
                    Some(text) => {
                        let hash = config_hash(text);
                        let put = tx
                            .prepare_cached(
                                "INSERT INTO configs(hash, text) VALUES ($1, $2)
                                 ON CONFLICT DO NOTHING",
                            )
                            .await?;
                        tx.execute(&put, &[&hash, &&**text]).await?;
                        Some(hash)
                    }
                    None => None,
                };
                let limits = serde_json::to_string(&tree.limits).map_err(EncodeError::from)?;
                let history = tree
                    .history
                    .as_ref()
                    .map(serde_json::to_string)
                    .transpose()
                    .map_err(EncodeError::from)?;
                let upsert = tx.prepare_cached(UPSERT).await?;
                let claimed = tx
                    .query_opt(
                        &upsert,
                        &[
                            &tree.tree_id.as_str(),
                            &tree.root_run_id.to_string(),
                            &tree.agent,
                            &tree.prompt,
                            &tree.params.as_ref().map(|p| p.to_string()),
                            &tree.model,
                            &limits,
                            &tree.origin,
                            &history,
                            &(tree.started_ms as i64),
                            &(now_ms() as i64),
                            &owner,
                            &holding,
                            &config,
                            // The owner is set once, never by the update.
                            &tree.principal,
                        ],
                    )
                    .await?;
                if let (Some(_), Some(url)) = (&claimed, &tree.webhook) {
                    let put = tx
                        .prepare_cached(
                            "INSERT INTO webhooks(run_id, tree_id, url, state, created_ms)
                             VALUES ($1, $2, $3, 'pending', $4) ON CONFLICT DO NOTHING",
                        )
                        .await?;
                    tx.execute(
                        &put,
                        &[
                            &tree.root_run_id.to_string(),
                            &tree.tree_id.as_str(),
                            url,
                            &(now_ms() as i64),
                        ],
                    )
                    .await?;
                }
                let epoch = claimed.as_ref().map(|r| {
                    let r = row(r);
                    let epoch = r.epoch;
                    rows.0.insert(tree.tree_id.to_string(), r);
                    epoch
                });
                b.tree_written(
                    &mut rows,
                    &tree.tree_id,
                    &tree.root_run_id.to_string(),
                    epoch,
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
                let mut held = Vec::new();
                for tree in trees {
                    if b.holds(&mut rows, tree)? {
                        held.push(tree.as_str());
                    }
                }
                if !held.is_empty() {
                    let beat = tx
                        .prepare_cached(
                            "UPDATE trees SET heartbeat_ms = $2
                             WHERE tree_id = ANY($1) AND owner != '-:released'",
                        )
                        .await?;
                    tx.execute(&beat, &[&held, &(now_ms() as i64)]).await?;
                }
            }
            Write::Release(trees) => {
                let mut held = Vec::new();
                for tree in trees {
                    if b.holds(&mut rows, tree)? {
                        held.push(tree.as_str());
                    }
                }
                if !held.is_empty() {
                    // No owner and no heartbeat: interrupted, whoever looks.
                    let release = tx
                        .prepare_cached(
                            "UPDATE trees SET owner = '-:released', heartbeat_ms = 0
                             WHERE tree_id = ANY($1) AND status = 'running' AND owner = $2",
                        )
                        .await?;
                    let released = tx.execute(&release, &[&held, &owner]).await?;
                    // The other replicas adopt them at once (delivered at
                    // commit), not at their next poll.
                    if released > 0 {
                        let wake = tx
                            .prepare_cached("SELECT pg_notify('arbor_released', $1)::TEXT")
                            .await?;
                        tx.query(&wake, &[&released.to_string()]).await?;
                    }
                }
            }
        }
    }
    // The segments, the row updates and the wake-ups, pipelined.
    let (mut seg_tree, mut seg_n, mut seg_body, mut seg_epoch, mut seg_seq) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let epochs: HashMap<Arc<str>, Option<i64>> = b
        .last_seqs()
        .map(|(t, _)| (t.clone(), b.epoch(t).map(|e| e as i64)))
        .collect();
    b.segments(&mut rows, |tree, n, body, seq| {
        seg_seq.push(seq as i64);
        seg_tree.push(tree.to_string());
        seg_n.push(n as i64);
        seg_body.push(body.to_vec());
        seg_epoch.push(epochs.get(tree).copied().flatten());
        Ok(())
    })?;
    let updates = b.updates(&mut rows)?;
    let wakes: Vec<String> = b
        .last_seqs()
        .filter(|(_, seq)| *seq > 0)
        .map(|(t, seq)| format!("{t}:{seq}"))
        .collect();
    let done = b.finish();
    let (insert, update, notify) = futures::try_join!(
        tx.prepare_cached(SEGMENTS),
        tx.prepare_cached(UPDATE),
        tx.prepare_cached(NOTIFY)
    )?;
    let u = |f: &dyn Fn(&crate::store::encode::TreeUpdate) -> i64| -> Vec<i64> {
        updates.iter().map(f).collect()
    };
    let u_tree: Vec<&str> = updates.iter().map(|u| &*u.tree_id).collect();
    let (last_seq, next_id, segments) = (
        u(&|u| u.last_seq as i64),
        u(&|u| u.next_id as i64),
        u(&|u| u.segments as i64),
    );
    let (agents, input, output) = (
        u(&|u| u.agents as i64),
        u(&|u| u.input_tokens as i64),
        u(&|u| u.output_tokens as i64),
    );
    let cost: Vec<f64> = updates.iter().map(|u| u.cost).collect();
    let epoch: Vec<Option<i64>> = updates.iter().map(|u| u.epoch.map(|e| e as i64)).collect();
    let status: Vec<Option<&str>> = updates
        .iter()
        .map(|u| u.end.as_ref().map(|(s, _, _)| s.as_str()))
        .collect();
    let error: Vec<Option<&str>> = updates
        .iter()
        .map(|u| u.end.as_ref().and_then(|(_, e, _)| e.as_deref()))
        .collect();
    let finished: Vec<Option<i64>> = updates
        .iter()
        .map(|u| u.end.as_ref().map(|(_, _, at)| *at as i64))
        .collect();
    let now = now_ms() as i64;
    let write_segments = async {
        if seg_tree.is_empty() {
            return Ok(0);
        }
        tx.execute(
            &insert,
            &[&seg_tree, &seg_n, &seg_body, &seg_epoch, &seg_seq],
        )
        .await
    };
    let write_rows = async {
        if u_tree.is_empty() {
            return Ok(0);
        }
        tx.execute(
            &update,
            &[
                &u_tree, &last_seq, &next_id, &segments, &agents, &input, &output, &cost, &epoch,
                &now, &status, &error, &finished,
            ],
        )
        .await
    };
    let wake = async {
        if wakes.is_empty() {
            return Ok(Vec::new());
        }
        tx.query(&notify, &[&wakes]).await
    };
    futures::try_join!(write_segments, write_rows, wake)?;
    tx.commit().await?;
    Ok(state.committed(done))
}

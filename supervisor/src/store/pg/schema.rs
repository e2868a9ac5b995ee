//! The database's schema and its versioned migrations, applied under an
//! advisory lock (of replicas starting at once, one migrates and the others
//! find it done).

use serde::Serialize;

use super::PgStore;
use crate::error::Error;

/// Migrations, in order; `arbor_schema` has a row for each one applied.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: the trees, their logs, their configs, and the control inbox. JSON is
    // kept as text (as written: `jsonb` would reorder its keys).
    r#"
CREATE TABLE trees (
    tree_id       TEXT PRIMARY KEY,
    root_run_id   TEXT NOT NULL,
    agent         TEXT NOT NULL,
    prompt        TEXT NOT NULL,
    params        TEXT,
    model         TEXT,
    limits        TEXT NOT NULL,
    origin        TEXT,
    history       TEXT,
    status        TEXT NOT NULL,
    error         TEXT,
    started_ms    BIGINT NOT NULL,
    finished_ms   BIGINT,
    heartbeat_ms  BIGINT NOT NULL,
    owner         TEXT NOT NULL,
    last_seq      BIGINT NOT NULL DEFAULT 0,
    next_id       BIGINT NOT NULL DEFAULT 1,
    segments      BIGINT NOT NULL DEFAULT 0,
    resumes       BIGINT NOT NULL DEFAULT 0,
    agents        BIGINT NOT NULL DEFAULT 0,
    input_tokens  BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    cost          DOUBLE PRECISION NOT NULL DEFAULT 0,
    epoch         BIGINT NOT NULL DEFAULT 0,
    config        TEXT,
    -- The order rows were made in: ties of started_ms list newest first.
    made          BIGSERIAL
);
CREATE INDEX trees_started ON trees(started_ms DESC, made DESC);
CREATE INDEX trees_status ON trees(status);
CREATE TABLE segments (
    tree_id TEXT NOT NULL,
    n       BIGINT NOT NULL,
    body    BYTEA NOT NULL,
    PRIMARY KEY (tree_id, n)
);
CREATE TABLE configs (
    hash TEXT PRIMARY KEY,
    text TEXT NOT NULL
);
CREATE TABLE controls (
    id        BIGSERIAL PRIMARY KEY,
    tree_id   TEXT NOT NULL,
    body      TEXT NOT NULL,
    posted_ms BIGINT NOT NULL
);
CREATE INDEX controls_tree ON controls(tree_id, id);
"#,
    // 2: each segment's highest event `seq` (0: it has no events; NULL: it
    // was written before this), so the journal past a `seq` is read from
    // the segments that hold it, not the whole log.
    "ALTER TABLE segments ADD COLUMN last_seq BIGINT;",
    // 3: no table changes: a run's first checkpoint may start from its
    // parent's last one (`"from"`, docs/store.md), which a build before
    // would read as a history without its inherited messages, so it must
    // refuse the database as newer.
    "-- checkpoints may start from the parent's",
    // 4: the principal that started each tree (a service's named caller),
    // who may see and control it; NULL for a tree started without one.
    r#"
ALTER TABLE trees ADD COLUMN principal TEXT;
CREATE INDEX trees_principal ON trees(principal, started_ms DESC, made DESC);
"#,
    // 5: follow-up turns waiting for their tree's running turn to end
    // (semantics §14), each with the turn number its root will have.
    r#"
CREATE TABLE queued_turns (
    id        BIGSERIAL PRIMARY KEY,
    tree_id   TEXT NOT NULL,
    turn      BIGINT NOT NULL,
    prompt    TEXT NOT NULL,
    params    TEXT,
    queued_ms BIGINT NOT NULL,
    UNIQUE (tree_id, turn)
);
"#,
    // 6: completion webhooks: one per tree that asked for one, written with
    // the tree, then each attempt's outcome; `owner` holds it for one
    // attempt until `held_ms`, under `epoch` (as trees are claimed).
    r#"
CREATE TABLE webhooks (
    tree_id    TEXT PRIMARY KEY,
    url        TEXT NOT NULL,
    state      TEXT NOT NULL,
    attempts   BIGINT NOT NULL DEFAULT 0,
    next_ms    BIGINT NOT NULL DEFAULT 0,
    error      TEXT,
    owner      TEXT,
    held_ms    BIGINT NOT NULL DEFAULT 0,
    epoch      BIGINT NOT NULL DEFAULT 0,
    created_ms BIGINT NOT NULL,
    done_ms    BIGINT
);
CREATE INDEX webhooks_pending ON webhooks(next_ms) WHERE state = 'pending';
"#,
    // 7: a webhook per run that asked for one (a tree's first run, or a
    // later turn's root), keyed by that run, and a queued turn's webhook
    // until it starts; the trees' rows of 6 are their
    // first runs'.
    r#"
ALTER TABLE webhooks ADD COLUMN run_id TEXT;
UPDATE webhooks SET run_id = tree_id || '/0';
ALTER TABLE webhooks ALTER COLUMN run_id SET NOT NULL;
ALTER TABLE webhooks DROP CONSTRAINT webhooks_pkey;
ALTER TABLE webhooks ADD PRIMARY KEY (run_id);
CREATE INDEX webhooks_tree ON webhooks(tree_id);
ALTER TABLE queued_turns ADD COLUMN webhook TEXT;
"#,
];

/// The advisory lock migrations hold ("ARBR" and 1).
const MIGRATION_LOCK: i64 = 0x4152_4252_0000_0001;

/// What `PgStore::migrate` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrateReport {
    /// The schema version the database had (0: none).
    pub from: i64,
    /// The version it has now.
    pub to: i64,
}

impl PgStore {
    /// Applies the migrations the database lacks, in one transaction under
    /// the advisory lock.
    pub(super) async fn migrate_here(&self) -> Result<MigrateReport, Error> {
        let io = self.io();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(&io)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(&io)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS arbor_schema (
                 version    INTEGER PRIMARY KEY,
                 applied_ms BIGINT NOT NULL
             )",
        )
        .await
        .map_err(&io)?;
        let from = version(&*tx).await.map_err(&io)?;
        let known = MIGRATIONS.len() as i64;
        if from > known {
            return Err(self.newer(from));
        }
        for (n, migration) in MIGRATIONS.iter().enumerate().skip(from as usize) {
            tx.batch_execute(migration)
                .await
                .map_err(|e| Error::StoreOpen {
                    path: self.shown.clone(),
                    reason: format!(
                        "migration {} of {known} failed: {}",
                        n + 1,
                        self.describe(&e)
                    ),
                    busy: false,
                })?;
            tx.execute(
                "INSERT INTO arbor_schema(version, applied_ms) VALUES ($1, $2)",
                &[&(n as i32 + 1), &(crate::tree::now_ms() as i64)],
            )
            .await
            .map_err(&io)?;
        }
        tx.commit().await.map_err(&io)?;
        Ok(MigrateReport { from, to: known })
    }

    /// Refuses a database without Arbor's schema, or with another version
    /// of it than this build's.
    pub(super) async fn check_schema(&self) -> Result<(), Error> {
        let io = self.io();
        let client = self.client().await?;
        let has: bool = client
            .query_one("SELECT to_regclass('arbor_schema') IS NOT NULL", &[])
            .await
            .map_err(&io)?
            .get(0);
        let known = MIGRATIONS.len() as i64;
        let found = if has {
            version(&**client).await.map_err(&io)?
        } else {
            0
        };
        let open_err = |reason: String| Error::StoreOpen {
            path: self.shown.clone(),
            reason,
            busy: false,
        };
        match found {
            0 => Err(open_err(
                "the database holds no Arbor store (run `arbor migrate --store URL` first)".into(),
            )),
            v if v > known => Err(self.newer(v)),
            v if v < known => Err(open_err(format!(
                "its schema is version {v}, this build needs {known} (run `arbor migrate --store URL`)"
            ))),
            _ => Ok(()),
        }
    }

    fn newer(&self, found: i64) -> Error {
        Error::NewerStore {
            path: self.shown.clone(),
            found,
            known: MIGRATIONS.len() as i64,
        }
    }
}

/// The schema version the database has.
async fn version(
    client: &impl tokio_postgres::GenericClient,
) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT COALESCE(max(version), 0)::BIGINT FROM arbor_schema",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

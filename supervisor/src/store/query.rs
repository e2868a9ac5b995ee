//! What both backends' queries share, written once: the summary's columns,
//! the list's status filter and page (which rows SQL narrows, and what is
//! counted from the rows it gives), a tree's record from its row's texts,
//! the controls taken from the inbox, and the loop that tries a batch
//! again. Each backend keeps only what differs: its SQL dialect's details
//! (through [`Dialect`]), its connections and its transactions.

use std::sync::Arc;
use std::time::Duration;

use arbor_actors::TreeId;
use serde_json::Value;

use crate::error::Error;
use crate::store::encode::WriterState;
use crate::store::{Control, Fenced, TreeFilter, TreeRecord, TreeStatus, TreeSummary};

/// A tree's summary, in the order a row's columns are read (with its
/// principal, column 15).
pub(crate) const SUMMARY: &str = "SELECT tree_id, root_run_id, agent, prompt, status, error,
        agents, input_tokens, output_tokens, cost, started_ms, finished_ms, heartbeat_ms,
        resumes, owner, principal
    FROM trees";

/// A tree's row as a dump carries it (`TreeRow`), every column in the
/// order both backends read and load it.
pub(crate) const TREE_ROW: &str = "tree_id, root_run_id, agent, prompt, params, model, limits,
        origin, history, status, error, started_ms, finished_ms, heartbeat_ms, owner, last_seq,
        next_id, segments, resumes, agents, input_tokens, output_tokens, cost, epoch, principal";

/// Columns of [`TREE_ROW`].
pub(crate) const TREE_ROW_COLUMNS: usize = 25;

/// What tells one backend's SQL from the other's, where a statement is
/// built here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// SQLite: parameters `?N`; rows made later have a higher `rowid`.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    Sqlite,
    /// Postgres: parameters `$N` (typed where nothing else says their
    /// type); rows made later have a higher `made`.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres,
}

impl Dialect {
    /// Parameter `n` of a text column.
    fn text(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres => format!("${n}"),
        }
    }

    /// Parameter `n` of a text column, where its type must be said.
    fn typed_text(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres => format!("${n}::TEXT"),
        }
    }

    /// Ties of `started_ms`, newest first.
    fn made(self) -> &'static str {
        match self {
            Dialect::Sqlite => "rowid",
            Dialect::Postgres => "made",
        }
    }

    /// Parameters `1..=n`, comma-separated.
    fn params(self, n: usize) -> String {
        (1..=n).map(|i| self.text(i)).collect::<Vec<_>>().join(", ")
    }

    /// The statement that reads a tree's row (parameter 1: its id).
    pub(crate) fn tree_row(self) -> String {
        format!(
            "SELECT {TREE_ROW} FROM trees WHERE tree_id = {}",
            self.text(1)
        )
    }

    /// The statement that loads a dumped tree's row: its columns in
    /// [`TREE_ROW`]'s order, then its config's hash (one more parameter).
    /// A tree stored under the same id is left as it is (nothing inserted).
    pub(crate) fn load_tree_row(self) -> String {
        let params = self.params(TREE_ROW_COLUMNS + 1);
        match self {
            Dialect::Sqlite => {
                format!("INSERT OR IGNORE INTO trees({TREE_ROW}, config) VALUES ({params})")
            }
            Dialect::Postgres => format!(
                "INSERT INTO trees({TREE_ROW}, config) VALUES ({params})
                 ON CONFLICT (tree_id) DO NOTHING"
            ),
        }
    }

    /// Rows from an offset (parameter `n`), without a limit.
    fn offset(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("LIMIT -1 OFFSET ?{n}"),
            Dialect::Postgres => format!("OFFSET ${n}"),
        }
    }
}

/// A list of trees as the database is asked for it, and what is left to
/// do with the rows it gives. The stored status narrows the rows in SQL;
/// `running` and `interrupted` are both stored as running (which one is
/// judged by the owner's liveness), so only they are told apart from the
/// rows, and only for them is the offset counted from the rows rather than
/// in SQL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Listing {
    /// The status asked for.
    status: Option<TreeStatus>,
    /// The status as stored, which SQL narrows by (parameter 1).
    pub(crate) stored: Option<TreeStatus>,
    /// Rows SQL skips (parameter 2).
    pub(crate) sql_offset: usize,
    /// Rows skipped from what SQL gives.
    offset: usize,
    /// Rows at most (`usize::MAX`: all).
    limit: usize,
}

impl Listing {
    /// The list `filter` asks for.
    pub(crate) fn new(filter: &TreeFilter) -> Self {
        let stored = filter.status.map(TreeStatus::stored);
        let derived = stored == Some(TreeStatus::Running);
        let sql_offset = if derived { 0 } else { filter.offset };
        Listing {
            status: filter.status,
            stored,
            sql_offset,
            offset: filter.offset - sql_offset,
            limit: if filter.limit == 0 {
                usize::MAX
            } else {
                filter.limit
            },
        }
    }

    /// The statement, `select` (the summary's columns `FROM trees`) newest
    /// first: the stored status is parameter 1, the
    /// offset parameter 2, and, when `by_principal`, the principal
    /// parameter 3 (else parameter 3 is null). A condition on a parameter
    /// that is null is written as that test, so the database uses its
    /// index on what is asked for.
    pub(crate) fn query(&self, select: &str, dialect: Dialect, by_principal: bool) -> String {
        let status = match self.stored {
            Some(_) => format!("status = {}", dialect.text(1)),
            None => format!("{} IS NULL", dialect.typed_text(1)),
        };
        let principal = match by_principal {
            true => format!("principal = {}", dialect.text(3)),
            false => format!("{} IS NULL", dialect.typed_text(3)),
        };
        format!(
            "{select} WHERE {status} AND {principal} ORDER BY started_ms DESC, {} DESC {}",
            dialect.made(),
            dialect.offset(2)
        )
    }

    /// The page from the rows the statement gave, in their order: those of
    /// the status asked for, past the offset, up to the limit. Reads no
    /// row past the page.
    pub(crate) fn page<E>(
        &self,
        rows: impl IntoIterator<Item = Result<TreeSummary, E>>,
    ) -> Result<Vec<TreeSummary>, E> {
        let mut out = Vec::new();
        let mut skipped = 0;
        for row in rows {
            let row = row?;
            if self.status.is_some_and(|s| s != row.status) {
                continue;
            }
            if skipped < self.offset {
                skipped += 1;
                continue;
            }
            out.push(row);
            if out.len() >= self.limit {
                break;
            }
        }
        Ok(out)
    }
}

/// The texts a tree's row keeps beside its summary, as stored.
pub(crate) struct RecordTexts {
    /// The params, as JSON.
    pub(crate) params: Option<String>,
    /// The model.
    pub(crate) model: Option<String>,
    /// The limits, as JSON.
    pub(crate) limits: String,
    /// Where its templates came from.
    pub(crate) origin: Option<String>,
    /// The conversation it started with, as JSON.
    pub(crate) history: Option<String>,
    /// The text of its config.
    pub(crate) config: Option<String>,
}

impl RecordTexts {
    /// The record of the tree `summary` describes; `bad` names what does
    /// not read.
    pub(crate) fn record(
        self,
        summary: &TreeSummary,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<TreeRecord, Error> {
        Ok(TreeRecord {
            tree_id: summary.tree_id.clone(),
            root_run_id: summary.root_run_id.clone(),
            agent: summary.agent.clone(),
            prompt: summary.prompt.clone(),
            params: self
                .params
                .map(|p| serde_json::from_str(&p))
                .transpose()
                .map_err(|e| bad(format!("params: {e}")))?,
            model: self.model,
            limits: serde_json::from_str(&self.limits).map_err(|e| bad(format!("limits: {e}")))?,
            origin: self.origin,
            config: self.config.map(Arc::from),
            history: self
                .history
                .map(|h| serde_json::from_str(&h))
                .transpose()
                .map_err(|e| bad(format!("history: {e}")))?,
            started_ms: summary.started_ms,
            principal: summary.principal.clone(),
            webhook: None,
        })
    }
}

/// The controls taken from the inbox (id, tree, body as stored), oldest
/// first; a control that is not JSON, or whose tree id is none, is the
/// store's (at `path`) corruption, named.
pub(crate) fn controls(
    taken: impl IntoIterator<Item = (u64, String, String)>,
    path: &str,
) -> Result<Vec<Control>, Error> {
    let mut out = Vec::new();
    for (id, text, body) in taken {
        let tree_id: TreeId = text.parse().map_err(|e| Error::StoreCorruptId {
            path: path.to_owned(),
            text: text.clone(),
            reason: format!("a control's tree id: {e}"),
        })?;
        let body: Value = serde_json::from_str(&body).map_err(|e| Error::StoreCorrupt {
            path: path.to_owned(),
            tree: tree_id.clone(),
            reason: format!("a control is not JSON: {e}"),
        })?;
        out.push(Control { id, tree_id, body });
    }
    out.sort_by_key(|c| c.id);
    Ok(out)
}

/// What a failed attempt at a batch calls for.
pub(crate) enum Retry {
    /// Try the batch again, after this pause.
    Again(Duration),
    /// Give up, with this error.
    Fail(Error),
}

/// `Store::write` on either backend: `attempt` at the batch until one
/// commits. A failed attempt's transaction was rolled back, so what the
/// cache says it wrote is forgotten; `judge` then says, from its error and
/// the attempts so far (1 for the first), whether to try again or give up.
pub(crate) fn write_batch<E>(
    state: &mut WriterState,
    mut attempt: impl FnMut(&mut WriterState) -> Result<Vec<Fenced>, E>,
    judge: impl Fn(E, u32) -> Retry,
) -> Result<Vec<Fenced>, Error> {
    let mut tries = 0;
    loop {
        match attempt(state) {
            Ok(fenced) => return Ok(fenced),
            Err(e) => {
                state.cache.clear();
                tries += 1;
                match judge(e, tries) {
                    Retry::Again(pause) => {
                        if !pause.is_zero() {
                            std::thread::sleep(pause);
                        }
                    }
                    Retry::Fail(error) => return Err(error),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::{Dialect, Listing, Retry, SUMMARY, TREE_ROW, TREE_ROW_COLUMNS, write_batch};
    use crate::error::Error;
    use crate::store::encode::WriterState;
    use crate::store::{TreeFilter, TreeRow, TreeStatus, TreeSummary};

    fn filter(status: Option<TreeStatus>, offset: usize, limit: usize) -> TreeFilter {
        TreeFilter {
            status,
            offset,
            limit,
        }
    }

    fn tree(id: &str, status: TreeStatus) -> Result<TreeSummary, ()> {
        let tree_id: arbor_actors::TreeId = id.parse().unwrap();
        Ok(TreeSummary {
            root_run_id: tree_id.root(),
            tree_id,
            agent: "a".into(),
            prompt: String::new(),
            status,
            error: None,
            agents: 1,
            input_tokens: 0,
            output_tokens: 0,
            cost: 0.0,
            started_ms: 0,
            finished_ms: None,
            resumes: 0,
            principal: None,
        })
    }

    #[test]
    fn a_listing_is_the_same_statement_on_both_backends_but_for_the_dialect() {
        let all = Listing::new(&filter(None, 5, 10));
        assert_eq!(
            all.query(SUMMARY, Dialect::Sqlite, false),
            format!(
                "{SUMMARY} WHERE ?1 IS NULL AND ?3 IS NULL \
                 ORDER BY started_ms DESC, rowid DESC LIMIT -1 OFFSET ?2"
            )
        );
        let failed = Listing::new(&filter(Some(TreeStatus::Failed), 5, 10));
        assert_eq!(
            failed.query(SUMMARY, Dialect::Postgres, true),
            format!(
                "{SUMMARY} WHERE status = $1 AND principal = $3 \
                 ORDER BY started_ms DESC, made DESC OFFSET $2"
            )
        );
        assert_eq!(
            all.query(SUMMARY, Dialect::Postgres, false),
            format!(
                "{SUMMARY} WHERE $1::TEXT IS NULL AND $3::TEXT IS NULL \
                 ORDER BY started_ms DESC, made DESC OFFSET $2"
            )
        );
        // SQL skips the offset, and narrows by the status as it is stored.
        assert_eq!(
            (failed.stored, failed.sql_offset),
            (Some(TreeStatus::Failed), 5)
        );
    }

    /// The tree row's columns are `TreeRow`'s fields, in order, and the
    /// load statement names one parameter per column and the config.
    #[test]
    fn a_tree_rows_columns_are_its_fields_in_order() {
        let row = TreeRow {
            tree_id: "t".into(),
            root_run_id: "t/0".into(),
            agent: "a".into(),
            prompt: "p".into(),
            params: Some("{}".into()),
            model: Some("m".into()),
            limits: "{}".into(),
            origin: Some("o".into()),
            history: Some("[]".into()),
            status: TreeStatus::Completed,
            error: Some("e".into()),
            started_ms: 0,
            finished_ms: Some(1),
            heartbeat_ms: 0,
            owner: "o".into(),
            last_seq: 0,
            next_id: 1,
            segments: 0,
            resumes: 0,
            agents: 1,
            input_tokens: 0,
            output_tokens: 0,
            cost: 0.0,
            epoch: 1,
            principal: Some("p".into()),
        };
        let json = serde_json::to_value(&row).unwrap();
        let fields: Vec<String> = json
            .as_object()
            .unwrap()
            .keys()
            .map(|k| {
                k.chars()
                    .flat_map(|c| match c.is_ascii_uppercase() {
                        true => vec!['_', c.to_ascii_lowercase()],
                        false => vec![c],
                    })
                    .collect()
            })
            .collect();
        let columns: Vec<&str> = TREE_ROW.split(',').map(str::trim).collect();
        assert_eq!(columns, fields);
        assert_eq!(columns.len(), TREE_ROW_COLUMNS);
        for dialect in [Dialect::Sqlite, Dialect::Postgres] {
            let load = dialect.load_tree_row();
            assert!(load.contains(&dialect.text(TREE_ROW_COLUMNS + 1)), "{load}");
            assert!(
                !load.contains(&dialect.text(TREE_ROW_COLUMNS + 2)),
                "{load}"
            );
        }
        assert_eq!(
            Dialect::Postgres.tree_row(),
            format!("SELECT {TREE_ROW} FROM trees WHERE tree_id = $1")
        );
    }

    /// A schema's shape: each table's columns, by name, with their kind
    /// (text, int, real, bytes) and whether they may be null, after every
    /// migration (`CREATE TABLE`, `ALTER TABLE … ADD COLUMN`; indexes aside).
    #[cfg(feature = "postgres")]
    fn shape(
        migrations: &[&str],
    ) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, (&'static str, bool)>>
    {
        let mut tables = std::collections::BTreeMap::new();
        let column = |def: &str| {
            let def = def.trim();
            let (name, rest) = def.split_once(char::is_whitespace).unwrap();
            let upper = rest.trim_start().to_ascii_uppercase();
            let kind = [
                "BIGSERIAL",
                "INTEGER",
                "BIGINT",
                "REAL",
                "DOUBLE",
                "BLOB",
                "BYTEA",
                "TEXT",
            ]
            .into_iter()
            .find(|k| upper.starts_with(k))
            .map(|k| match k {
                "BIGSERIAL" | "INTEGER" | "BIGINT" => "int",
                "REAL" | "DOUBLE" => "real",
                "BLOB" | "BYTEA" => "bytes",
                _ => "text",
            })
            .unwrap_or_else(|| panic!("a column of no known type: {def}"));
            let not_null = ["NOT NULL", "PRIMARY KEY", "BIGSERIAL"]
                .iter()
                .any(|k| upper.contains(k));
            (name.to_owned(), (kind, not_null))
        };
        for migration in migrations {
            let text: String = migration
                .lines()
                .map(|l| l.split("--").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            for statement in text.split(';').map(str::trim).filter(|s| !s.is_empty()) {
                let words: Vec<&str> = statement.split_whitespace().collect();
                match words.as_slice() {
                    ["CREATE", "TABLE", name, ..] => {
                        let name = name.trim_end_matches('(');
                        let open = statement.find('(').unwrap();
                        let body = &statement[open + 1..statement.rfind(')').unwrap()];
                        let (mut depth, mut start, mut defs) = (0, 0, Vec::new());
                        for (i, c) in body.char_indices() {
                            match c {
                                '(' => depth += 1,
                                ')' => depth -= 1,
                                ',' if depth == 0 => {
                                    defs.push(&body[start..i]);
                                    start = i + 1;
                                }
                                _ => {}
                            }
                        }
                        defs.push(&body[start..]);
                        let columns: std::collections::BTreeMap<_, _> = defs
                            .into_iter()
                            .filter(|d| {
                                let d = d.trim_start();
                                !d.starts_with("PRIMARY KEY") && !d.starts_with("UNIQUE")
                            })
                            .map(column)
                            .collect();
                        tables.insert(name.to_owned(), columns);
                    }
                    ["ALTER", "TABLE", name, "ADD", "COLUMN", ..] => {
                        let def = statement.split("ADD COLUMN").nth(1).unwrap();
                        let (col, kind) = column(def);
                        tables.get_mut(*name).unwrap().insert(col, kind);
                    }
                    [
                        "ALTER",
                        "TABLE",
                        name,
                        "ALTER",
                        "COLUMN",
                        col,
                        "SET",
                        "NOT",
                        "NULL",
                    ] => {
                        let column = tables.get_mut(*name).unwrap().get_mut(*col).unwrap();
                        column.1 = true;
                    }
                    ["ALTER", "TABLE", name, "RENAME", "TO", to] => {
                        let table = tables.remove(*name).unwrap();
                        tables.insert((*to).to_owned(), table);
                    }
                    ["DROP", "TABLE", name] => {
                        tables.remove(*name).unwrap();
                    }
                    // Keys and rows: the columns' shape is as it was.
                    ["ALTER", "TABLE", _, "DROP", "CONSTRAINT", ..]
                    | ["ALTER", "TABLE", _, "ADD", "PRIMARY", "KEY", ..]
                    | ["INSERT", ..]
                    | ["UPDATE", ..]
                    | ["CREATE", "INDEX", ..] => {}
                    other => panic!("a statement this test does not read: {other:?}"),
                }
            }
        }
        tables
    }

    /// Both backends' migrations end in one shape: the same tables, with
    /// the same columns of the same kinds (Postgres adds only `made`, the
    /// order rows were made in, which SQLite's `rowid` is).
    #[cfg(feature = "postgres")]
    #[test]
    fn both_backends_schemas_have_one_shape() {
        let sqlite = shape(crate::store::sqlite::MIGRATIONS);
        let mut pg = shape(crate::store::pg::MIGRATIONS);
        assert_eq!(
            pg.get_mut("trees").unwrap().remove("made"),
            Some(("int", true))
        );
        assert_eq!(sqlite, pg);
        let trees = &sqlite["trees"];
        for column in TREE_ROW.split(',').map(str::trim) {
            assert!(trees.contains_key(column), "{column}");
        }
        assert_eq!(
            trees.len(),
            TREE_ROW_COLUMNS + 1,
            "the tree row and its config"
        );
        assert_eq!(
            sqlite.keys().collect::<Vec<_>>(),
            [
                "configs",
                "controls",
                "queued_turns",
                "segments",
                "trees",
                "webhooks"
            ]
        );
    }

    #[test]
    fn interrupted_trees_are_told_from_running_ones_and_paged_from_the_rows() {
        let listing = Listing::new(&filter(Some(TreeStatus::Interrupted), 1, 2));
        // Both are stored as running: SQL narrows to those, skips nothing.
        assert_eq!(
            (listing.stored, listing.sql_offset),
            (Some(TreeStatus::Running), 0)
        );
        let rows = [
            tree("a", TreeStatus::Interrupted),
            tree("b", TreeStatus::Running),
            tree("c", TreeStatus::Interrupted),
            tree("d", TreeStatus::Interrupted),
            tree("e", TreeStatus::Interrupted),
            Err(()),
        ];
        let page = listing.page(rows).unwrap();
        let ids: Vec<&str> = page.iter().map(|t| t.tree_id.as_str()).collect();
        // Past one interrupted tree, two of them; the row after the page
        // (an error) is never read.
        assert_eq!(ids, ["c", "d"]);
        let all = Listing::new(&filter(None, 0, 0));
        let rows = (0..3).map(|i| tree(&i.to_string(), TreeStatus::Completed));
        assert_eq!(all.page(rows).unwrap().len(), 3);
    }

    #[test]
    fn a_batch_is_tried_until_it_commits_or_its_judge_gives_up() {
        let mut state = WriterState::default();
        let mut attempts = 0;
        let fenced = write_batch(
            &mut state,
            |_| {
                attempts += 1;
                if attempts < 3 {
                    Err("busy")
                } else {
                    Ok(Vec::new())
                }
            },
            |_, _| Retry::Again(std::time::Duration::ZERO),
        )
        .unwrap();
        assert!(fenced.is_empty());
        assert_eq!(attempts, 3);
        let failed = write_batch(
            &mut state,
            |_| Err::<Vec<_>, _>("broken"),
            |e, tries| match tries {
                1 => Retry::Again(std::time::Duration::ZERO),
                _ => Retry::Fail(Error::Store(format!("{e} after {tries}"))),
            },
        )
        .unwrap_err();
        assert_eq!(
            failed.to_string(),
            Error::Store("broken after 2".into()).to_string()
        );
    }
}

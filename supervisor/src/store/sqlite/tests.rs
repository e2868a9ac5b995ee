//! The SQLite file's own unit tests: migrations of an older file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use arbor_actors::{Event, EventKind};
use rusqlite::Connection;

use super::SqliteStore;
use super::schema::{APPLICATION_ID, MIGRATIONS};
use crate::store::{Store, Write};

/// A tree id from a test's literal.
fn as_tree(id: &str) -> arbor_actors::TreeId {
    id.parse().unwrap()
}

fn event(tree: &str, seq: u64) -> Write {
    Write::Event(Arc::new(Event {
        seq,
        tree_id: tree.parse().unwrap(),
        run_id: (format!("{tree}/0")).parse().unwrap(),
        at_ms: 1,
        kind: EventKind::StepStarted { step: seq as u32 },
    }))
}

/// The segment numbers of a tree, in order.
fn segments(db: &Connection, tree: &str) -> Vec<i64> {
    let mut stmt = db
        .prepare("SELECT n FROM segments WHERE tree_id = ?1 ORDER BY n")
        .unwrap();
    stmt.query_map([tree], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

// Fencing's semantics (a stale epoch's batch refused, a new tree on a stored
// id fenced out) are tested on both backends in `tests/it/store.rs`.

/// A store of schema version 1 (before epochs) is upgraded when opened
/// for writing: its trees get epoch 0, and the next claim takes 1.
#[test]
fn a_store_from_before_fencing_is_upgraded_and_its_trees_can_be_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    {
        let db = Connection::open(&path).unwrap();
        db.execute_batch(MIGRATIONS[0]).unwrap();
        db.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        db.pragma_update(None, "user_version", 1).unwrap();
        db.execute(
            "INSERT INTO trees(tree_id, root_run_id, agent, prompt, limits, status,
                 started_ms, heartbeat_ms, owner)
             VALUES ('t', 't/0', 'a', 'p', '{}', 'running', 1, 0, '-:1')",
            [],
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let db = Connection::open(&path).unwrap();
    let version: i64 = db
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, MIGRATIONS.len() as i64);
    let epoch: i64 = db
        .query_row("SELECT epoch FROM trees WHERE tree_id = 't'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(epoch, 0);
    assert_eq!(store.claim(&as_tree("t")).unwrap(), 1);
    assert!(store.write(&[event("t", 1)]).unwrap().is_empty());
    assert_eq!(segments(&db, "t"), vec![1]);
}

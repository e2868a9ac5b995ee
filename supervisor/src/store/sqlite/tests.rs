//! The store's unit tests: fencing in the write path, and migrations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use arbor_actors::{Event, EventKind};
use rusqlite::Connection;

use super::SqliteStore;
use super::schema::{APPLICATION_ID, MIGRATIONS};
use crate::limits::TreeLimits;
use crate::store::{Fenced, Store, TreeRecord, Write};

fn record(tree: &str) -> Write {
    Write::Tree(Box::new(TreeRecord {
        tree_id: tree.into(),
        root_run_id: format!("{tree}/0"),
        agent: "a".into(),
        prompt: "p".into(),
        params: None,
        model: None,
        limits: TreeLimits::default(),
        origin: None,
        config: None,
        history: None,
        started_ms: 1,
    }))
}

fn event(tree: &str, seq: u64) -> Write {
    Write::Event(Arc::new(Event {
        seq,
        tree_id: tree.into(),
        run_id: format!("{tree}/0").into(),
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

/// What its owner gone looks like (a crash out of sight): no live owner,
/// an old heartbeat.
fn abandon(db: &Connection, tree: &str) {
    db.execute(
        "UPDATE trees SET owner = '-:1', heartbeat_ms = 0 WHERE tree_id = ?1",
        [tree],
    )
    .unwrap();
}

/// Split brain (issue 12, defect 12): a writer paused past its lease
/// goes on writing after another took its tree over. Its batch for that
/// tree is refused whole (no segment, no heartbeat, no release), the
/// rest of the batch lands, and the new owner's log stays contiguous.
#[test]
fn an_older_epochs_batch_is_refused_and_nothing_of_it_lands() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let old = SqliteStore::open(&path).unwrap();
    assert!(
        old.write(&[record("t"), record("u"), event("t", 1), event("u", 1)])
            .unwrap()
            .is_empty()
    );
    let db = Connection::open(&path).unwrap();
    abandon(&db, "t");
    let new = SqliteStore::open(&path).unwrap();
    assert_eq!(new.claim("t").unwrap(), 2, "the second claim of t");
    let owner: String = db
        .query_row("SELECT owner FROM trees WHERE tree_id = 't'", [], |r| {
            r.get(0)
        })
        .unwrap();
    let fenced = old
        .write(&[
            event("t", 2),
            event("u", 2),
            Write::Heartbeat(vec!["t".into(), "u".into()]),
        ])
        .unwrap();
    assert_eq!(
        fenced,
        vec![Fenced {
            tree_id: "t".into(),
            epoch: 1,
            current: 2,
            owner: owner.clone(),
        }]
    );
    assert_eq!(segments(&db, "t"), vec![1], "the fenced batch wrote to t");
    assert_eq!(segments(&db, "u"), vec![1, 2], "u's writes were lost");
    let (beat, seq): (i64, i64) = db
        .query_row(
            "SELECT heartbeat_ms, last_seq FROM trees WHERE tree_id = 't'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(seq, 1);
    assert!(beat > 0, "the new owner's heartbeat was kept");
    // Still refused later, and a release does not undo the new claim.
    let again = old
        .write(&[event("t", 3), Write::Release(vec!["t".into()])])
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(segments(&db, "t"), vec![1]);
    // The new owner writes on where the log ends: no UNIQUE clash.
    assert!(new.write(&[record("t"), event("t", 2)]).unwrap().is_empty());
    assert!(new.write(&[event("t", 3)]).unwrap().is_empty());
    assert_eq!(segments(&db, "t"), vec![1, 2, 3]);
    assert_eq!(new.events("t", 0).unwrap().len(), 3);
    let (status, owner_now): (String, String) = db
        .query_row(
            "SELECT status, owner FROM trees WHERE tree_id = 't'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((status.as_str(), owner_now), ("running", owner));
}

/// A new tree that lands on a stored id holds no claim: it takes
/// nothing over, and is reported fenced out.
#[test]
fn a_new_tree_on_a_stored_id_is_fenced_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let first = SqliteStore::open(&path).unwrap();
    first.write(&[record("t"), event("t", 1)]).unwrap();
    let second = SqliteStore::open(&path).unwrap();
    let fenced = second.write(&[record("t"), event("t", 1)]).unwrap();
    assert_eq!(fenced.len(), 1);
    assert_eq!((fenced[0].epoch, fenced[0].current), (0, 1));
    let db = Connection::open(&path).unwrap();
    assert_eq!(segments(&db, "t"), vec![1]);
    assert!(first.write(&[event("t", 2)]).unwrap().is_empty());
}

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
    assert_eq!(store.claim("t").unwrap(), 1);
    assert!(store.write(&[event("t", 1)]).unwrap().is_empty());
    assert_eq!(segments(&db, "t"), vec![1]);
}

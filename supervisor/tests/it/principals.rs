//! Who started a tree (its principal, issue 33) is stored with it on both
//! backends: read back by `principal`, `tree`, the listings and a dump,
//! listed by owner a page at a time, never changed by a resume, copied with
//! the tree; and an older SQLite store without the column is read as it is.

use std::sync::Arc;

use crate::backend::{Backend, both_backends};
use crate::common::{TreeId, as_tree};
use arbor_supervisor::store::{SqliteStore, Store, TreeFilter, TreeRecord, Write};
use arbor_supervisor::{Error, TreeLimits};

/// A new tree `tree` started by `principal`, at `started_ms`.
fn started(tree: &str, principal: Option<&str>, started_ms: u64) -> Write {
    Write::Tree(Box::new(TreeRecord {
        tree_id: as_tree(tree),
        root_run_id: as_tree(tree).root(),
        agent: "a".into(),
        prompt: format!("{tree}'s prompt"),
        params: None,
        model: None,
        limits: TreeLimits::default(),
        origin: None,
        config: None,
        history: None,
        started_ms,
        principal: principal.map(str::to_owned),
        webhook: None,
    }))
}

/// The ids `trees_of` lists for `principal`, `limit` from `offset`.
fn ids_of(store: &dyn Store, principal: &str, limit: usize, offset: usize) -> Vec<TreeId> {
    let filter = TreeFilter {
        status: None,
        limit,
        offset,
    };
    store
        .trees_of(&filter, principal)
        .unwrap()
        .into_iter()
        .map(|t| t.tree_id)
        .collect()
}

both_backends! {
    fn the_principal_that_started_a_tree_is_stored_with_it_and_never_changes(backend) {
        let place = backend.fresh();
        let store = place.open();
        store
            .write(&[
                started("a1", Some("alice"), 1),
                started("b1", Some("bob"), 2),
                started("a2", Some("alice"), 3),
                started("n1", None, 4),
                started("a3", Some("alice"), 5),
            ])
            .unwrap();
        // Read back, by every reader, from another process (replica) too.
        let other = place.open();
        for store in [&store, &other] {
            assert_eq!(store.principal(&as_tree("a1")).unwrap().as_deref(), Some("alice"));
            assert_eq!(store.principal(&as_tree("b1")).unwrap().as_deref(), Some("bob"));
            assert_eq!(store.principal(&as_tree("n1")).unwrap(), None);
            assert!(matches!(store.principal(&as_tree("nope")), Err(Error::UnknownTree(t)) if t == "nope"));
            let (record, summary) = store.tree(&as_tree("b1")).unwrap();
            assert_eq!(record.principal.as_deref(), Some("bob"));
            assert_eq!(summary.principal.as_deref(), Some("bob"));
            let listed: Vec<(String, Option<String>)> = store
                .trees(&TreeFilter::default())
                .unwrap()
                .into_iter()
                .map(|t| (t.tree_id.to_string(), t.principal))
                .collect();
            assert_eq!(
                listed,
                vec![
                    ("a3".into(), Some("alice".into())),
                    ("n1".into(), None),
                    ("a2".into(), Some("alice".into())),
                    ("b1".into(), Some("bob".into())),
                    ("a1".into(), Some("alice".into())),
                ]
            );
        }
        // One owner's trees, newest first, a page at a time: the pages count
        // only that owner's trees.
        assert_eq!(ids_of(&*store, "alice", 0, 0), ["a3", "a2", "a1"]);
        assert_eq!(ids_of(&*store, "alice", 2, 0), ["a3", "a2"]);
        assert_eq!(ids_of(&*store, "alice", 2, 2), ["a1"]);
        assert_eq!(ids_of(&*store, "bob", 10, 0), ["b1"]);
        assert!(ids_of(&*store, "carol", 10, 0).is_empty());
        // Not a prefix or pattern match.
        assert!(ids_of(&*store, "ali%", 10, 0).is_empty());
        let running = TreeFilter {
            status: Some(arbor_supervisor::TreeStatus::Running),
            limit: 1,
            offset: 1,
        };
        let page: Vec<TreeId> = store
            .trees_of(&running, "alice")
            .unwrap()
            .into_iter()
            .map(|t| t.tree_id)
            .collect();
        assert_eq!(page, ["a2"]);

        // A resume writes the tree's record again, claimed: whatever that
        // record says, the owner stays the one that started it.
        place.execute("UPDATE trees SET owner = '-:1', heartbeat_ms = 0 WHERE tree_id = 'a1'");
        let adopter = place.open();
        adopter.claim(&as_tree("a1")).unwrap();
        assert!(adopter.write(&[started("a1", Some("mallory"), 1)]).unwrap().is_empty());
        assert_eq!(store.principal(&as_tree("a1")).unwrap().as_deref(), Some("alice"));
        assert_eq!(store.tree(&as_tree("a1")).unwrap().0.principal.as_deref(), Some("alice"));
        // A new tree landing on a stored id takes nothing over either.
        let fenced = place.open().write(&[started("b1", Some("mallory"), 9)]).unwrap();
        assert_eq!(fenced.len(), 1);
        assert_eq!(store.principal(&as_tree("b1")).unwrap().as_deref(), Some("bob"));

        // A dump carries it; the copy in a fresh store of either backend has it.
        let dump = store.dump(&as_tree("a2")).unwrap();
        assert_eq!(dump.row.principal.as_deref(), Some("alice"));
        let copy = Backend::Sqlite.fresh();
        let copied = copy.open();
        copied.load(&dump).unwrap();
        assert_eq!(copied.principal(&as_tree("a2")).unwrap().as_deref(), Some("alice"));
        assert_eq!(copied.dump(&as_tree("a2")).unwrap(), dump);
        // A dump made before principals (no such key) loads as nobody's.
        let mut old = serde_json::to_value(store.dump(&as_tree("b1")).unwrap()).unwrap();
        old["row"].as_object_mut().unwrap().remove("principal");
        old["row"]["treeId"] = "old".into();
        let old: arbor_supervisor::store::TreeDump = serde_json::from_value(old).unwrap();
        copied.load(&old).unwrap();
        assert_eq!(copied.principal(&as_tree("old")).unwrap(), None);
    }
}

/// A store written before principals (schema version 6, no `principal`
/// column) is read as it is by the read-only commands, every tree nobody's,
/// and migrated by the next writer, its trees still nobody's.
#[test]
fn a_sqlite_store_from_before_principals_reads_as_nobodys_trees() {
    let place = Backend::Sqlite.fresh();
    {
        let store = place.open();
        store
            .write(&[started("t", Some("alice"), 1), started("u", None, 2)])
            .unwrap();
    }
    // Back to version 6: the column and its index gone (and version 8's
    // queued turns, version 9's webhooks).
    place.execute(
        "DROP INDEX trees_principal; ALTER TABLE trees DROP COLUMN principal;
         DROP TABLE queued_turns; DROP TABLE webhooks; PRAGMA user_version = 6;",
    );
    let read: Arc<dyn Store> = Arc::new(SqliteStore::open_read_only(place.at.as_ref()).unwrap());
    assert_eq!(read.principal(&as_tree("t")).unwrap(), None);
    assert!(matches!(
        read.principal(&as_tree("nope")),
        Err(Error::UnknownTree(_))
    ));
    assert_eq!(read.tree(&as_tree("t")).unwrap().0.principal, None);
    let listed = read.trees(&TreeFilter::default()).unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|t| t.principal.is_none()));
    assert!(
        read.trees_of(&TreeFilter::default(), "alice")
            .unwrap()
            .is_empty()
    );
    drop(read);
    // The next writer migrates it; the old trees stay nobody's, new ones
    // are their principal's.
    let store = place.open();
    assert_eq!(store.principal(&as_tree("t")).unwrap(), None);
    store.write(&[started("v", Some("alice"), 3)]).unwrap();
    assert_eq!(ids_of(&*store, "alice", 0, 0), ["v"]);
}

//! The store under real trees, on both backends (`both_backends!`): resume
//! from any prefix of a log, the journal as live readers see it, release,
//! fencing, the control inbox, copying a tree between backends; and what is
//! the SQLite file's own (what a long history costs on disk, a store that
//! fills up mid-run) or Postgres's own (replicas on one database, the
//! database's fence, concurrent migrations, the password, wake-ups).

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Backend, both_backends};
use crate::common::*;
use arbor_actors::{AgentState, AgentStatus, Model, Tool};
use arbor_supervisor::store::{
    PgStore, Segment, SqliteStore, Store, TreeDump, TreeFilter, TreeRecord, TreeStatus, Write,
};
use arbor_supervisor::{Catalog, Supervisor, TreeLimits};
use serde_json::{Value, json};

/// `bytes` of pseudo-random words (text that compresses about as well as prose).
fn words(bytes: usize, seed: u64) -> String {
    const WORDS: [&str; 16] = [
        "latency", "budget", "tree", "agent", "merge", "history", "spawn", "tool", "result",
        "model", "step", "limit", "store", "replay", "resume", "event",
    ];
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut text = String::with_capacity(bytes + 16);
    while text.len() < bytes {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.push_str(WORDS[(x >> 60) as usize]);
        text.push_str(if (x >> 20).is_multiple_of(7) {
            ". "
        } else {
            " "
        });
        text.push_str(&format!("{}", (x >> 33) % 1000));
        text.push(' ');
    }
    text.truncate(bytes);
    text
}

/// A script for one agent: `steps` steps of nine `echo` calls with `bytes`-long
/// inputs (ten new messages a step), then a closing answer.
fn long_script(steps: usize, bytes: usize) -> Value {
    let mut replies: Vec<Value> = (0..steps)
        .map(|s| {
            let calls: Vec<Value> = (0..9)
                .map(|i| {
                    let text = words(bytes, (s * 9 + i) as u64);
                    json!({"name": "echo", "input": {"note": text}})
                })
                .collect();
            json!({"text": format!("Step {s}: nine notes."), "toolCalls": calls})
        })
        .collect();
    replies.push(json!({"text": "All notes taken."}));
    json!({"replies": [{"agent": "scribe", "steps": replies}]})
}

fn stored_supervisor(store: Arc<dyn Store>, script: Value) -> Supervisor {
    let model = scripted(script);
    let catalog = Catalog::builder()
        .model(model as Arc<dyn Model>)
        .tool(echo() as Arc<dyn Tool>)
        .template(with_echo(template("scribe")).max_steps(200))
        .build()
        .unwrap();
    Supervisor::new(catalog, TreeLimits::default())
        .with_store(store)
        .unwrap()
}

/// Every record of every segment, decoded.
pub(crate) fn records(db: &rusqlite::Connection) -> Vec<Value> {
    let mut stmt = db
        .prepare("SELECT body FROM segments ORDER BY tree_id, n")
        .unwrap();
    let bodies = stmt
        .query_map([], |r| r.get::<_, Vec<u8>>(0))
        .unwrap()
        .map(Result::unwrap);
    bodies
        .flat_map(|b| {
            let json = lz4_flex::decompress_size_prepended(&b).unwrap();
            serde_json::from_slice::<Vec<Value>>(&json).unwrap()
        })
        .collect()
}

fn file_bytes(path: &std::path::Path) -> u64 {
    let wal = std::path::PathBuf::from(format!("{}-wal", path.display()));
    std::fs::metadata(path).unwrap().len() + std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_messages_over_a_hundred_checkpoints_take_under_three_times_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("size.db");
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    let sup = stored_supervisor(store.clone(), long_script(100, 300));
    let result = finish(start(&sup, "scribe", "Take notes.").await).await;
    sup.flush().await.unwrap();
    let state = &result.state;
    assert_eq!(state.status, AgentStatus::Completed);
    assert!(
        state.message_history.len() >= 1000,
        "{}",
        state.message_history.len()
    );
    let message_bytes: usize = state
        .message_history
        .iter()
        .map(|m| serde_json::to_string(&**m).unwrap().len())
        .sum();

    // Every step boundary was checkpointed, and the stored state is the state.
    let db = rusqlite::Connection::open(&path).unwrap();
    assert_eq!(records(&db).iter().filter(|r| r["f"] == false).count(), 100);
    db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(db);
    let stored = store.run(&state.run_id).unwrap();
    assert!(stored.is_final);
    assert_eq!(stored.state.as_ref(), Some(&**state));

    let bytes = file_bytes(&path);
    let ratio = bytes as f64 / message_bytes as f64;
    println!("{message_bytes} bytes of messages, store file {bytes} bytes: {ratio:.2}×");
    assert!(
        ratio < 3.0,
        "the store takes {ratio:.2}× the messages' bytes"
    );
}

/// A store whose disk filled up mid-run: the tree waits (no step taken
/// that could not be recorded, nothing failed), a start is refused naming
/// the full disk, and once there is room again the writes held go through
/// and the tree completes, whole, on its own. (The disk is a cap on the
/// file, `SqliteStore::set_max_bytes`: SQLite's own `SQLITE_FULL`, what a
/// full filesystem gives it; the CLI test fills a real one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_pauses_the_tree_until_space_is_freed_then_it_completes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.db");
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    // Room for the empty schema and a little more, not for a long history.
    store.set_max_bytes(file_bytes(&path) + 256 * 1024).unwrap();
    let sup = stored_supervisor(store.clone(), long_script(150, 2000));
    let handle = start(&sup, "scribe", "Take notes.").await;
    let down = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some(down) = sup.store_down() {
                return down;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the store reports its full disk");
    assert!(down.disk_full, "{down}");
    let text = down.to_string();
    assert!(text.starts_with("the store's disk is full at "), "{text}");
    assert!(
        sup.store_failure().is_none(),
        "a full disk is not a failure"
    );
    // No new tree starts meanwhile, and the refusal says why.
    let refused = sup.start(request("scribe", "again")).await;
    assert!(
        matches!(
            &refused,
            Err(arbor_supervisor::Error::StoreUnavailable {
                disk_full: true,
                ..
            })
        ),
        "{:?}",
        refused.err()
    );
    // The tree waits: its steps stop while the store is down.
    let steps = handle.steps();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        handle.steps() <= steps + 1,
        "{} steps after {steps}",
        handle.steps()
    );
    // Room again: it goes on by itself.
    store.set_max_bytes(1 << 40).unwrap();
    let result = finish(handle).await;
    assert_eq!(
        result.state.status,
        AgentStatus::Completed,
        "{:?}",
        result.state.error_message()
    );
    assert!(sup.store_down().is_none());
    sup.flush().await.unwrap();
    drop(sup);
    let reopened = SqliteStore::open(&path).unwrap();
    let trees = reopened.trees(&TreeFilter::default()).unwrap();
    assert_eq!(trees.len(), 1);
    assert_eq!(trees[0].status, arbor_supervisor::TreeStatus::Completed);
    let stored = reopened.run(&result.state.run_id).unwrap();
    assert_eq!(stored.state.as_ref(), Some(&*result.state));
}

/// A store that stays full past `fail_after`: the run fails naming the
/// full disk, no new tree starts, and the file is intact and still lists
/// the tree (released: the next process resumes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_full_past_fail_after_fails_the_run_with_the_reason_and_stays_readable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.db");
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    store.set_max_bytes(file_bytes(&path) + 256 * 1024).unwrap();
    let sup = stored_supervisor(store.clone(), long_script(150, 2000))
        .with_store_fail_after(Duration::from_millis(500));
    let result = finish(start(&sup, "scribe", "Take notes.").await).await;
    assert_eq!(result.state.status, AgentStatus::Failed);
    let error = result.state.error_message().unwrap_or_default().to_owned();
    assert!(error.contains("the store failed"), "{error}");
    assert!(error.contains("disk is full"), "{error}");
    // No new tree starts on a store that failed.
    let refused = sup.start(request("scribe", "again")).await;
    assert!(
        matches!(&refused, Err(arbor_supervisor::Error::Store(e)) if e.contains("full")),
        "{:?}",
        refused.err()
    );
    drop(sup);
    // The file is intact and still lists the tree (as not finished).
    let db = rusqlite::Connection::open(&path).unwrap();
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    drop(db);
    let reopened = SqliteStore::open(&path).unwrap();
    let trees = reopened.trees(&TreeFilter::default()).unwrap();
    assert_eq!(trees.len(), 1);
    assert_eq!(trees[0].tree_id, "t");
    assert_ne!(trees[0].status, arbor_supervisor::TreeStatus::Completed);
}

/// A boss whose first step hands its history to an inline scribe, which takes
/// the boss's system prompt and toolbox (`inherit_parent_system_prompt`) and
/// steps three times, calling a tool only that toolbox has.
fn boss_and_scribe(store: Arc<dyn Store>) -> Supervisor {
    let model = scripted(json!({"replies": [
        {"agent": "boss", "steps": [
            {"text": "Handing over.", "toolCalls": [
                {"name": "spawn_agent_inline", "input": {"agent_type": "scribe", "prompt": "write it"}}
            ]},
            {"text": "Done."}
        ]},
        {"agent": "scribe", "steps": [
            {"text": "Trying.", "toolCalls": [{"name": "echo", "input": {"n": 1}}]},
            {"text": "Again.", "toolCalls": [{"name": "echo", "input": {"n": 2}}]},
            {"text": "Written."}
        ]}
    ]}));
    let mut scribe = template("scribe").system_prompt("You write.");
    scribe.inherit_parent_system_prompt = true;
    let boss = with_echo(template("boss").system_prompt("You delegate.")).spawns(&["scribe"]);
    let catalog = Catalog::builder()
        .model(model as Arc<dyn Model>)
        .tool(echo() as Arc<dyn Tool>)
        .template(boss)
        .template(scribe)
        .build()
        .unwrap();
    Supervisor::new(catalog, TreeLimits::default())
        .with_store(store)
        .unwrap()
}

/// A two-thread runtime for a test that runs trees on it one after another
/// (a store's writer needs real threads; each `block_on` is a process's life).
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A copy of the SQLite store at `from` whose tree `t` holds only the first
/// `keep` records of its log, as if the process had died there, its owner gone.
pub(crate) fn cut(from: &std::path::Path, to: &std::path::Path, records: &[Value], keep: usize) {
    let db = rusqlite::Connection::open(from).unwrap();
    db.execute("VACUUM INTO ?1", [to.to_str().unwrap()])
        .unwrap();
    let db = rusqlite::Connection::open(to).unwrap();
    let seq = records[..keep]
        .iter()
        .filter_map(|r| r["seq"].as_i64())
        .max()
        .unwrap_or(0);
    let json = serde_json::to_string(&records[..keep]).unwrap();
    db.execute("DELETE FROM segments", []).unwrap();
    db.execute(
        "INSERT INTO segments(tree_id, n, body) VALUES ('t', 1, ?1)",
        [lz4_flex::compress_prepend_size(json.as_bytes())],
    )
    .unwrap();
    db.execute(
        "UPDATE trees SET status = 'running', finished_ms = NULL, error = NULL, owner = '-:0',
             heartbeat_ms = 0, last_seq = ?1, segments = 1",
        [seq],
    )
    .unwrap();
}

/// Every record of a dumped tree's log, decoded.
pub(crate) fn dumped_records(dump: &TreeDump) -> Vec<Value> {
    dump.segments
        .iter()
        .flat_map(|s| {
            let json = lz4_flex::decompress_size_prepended(&s.body).unwrap();
            serde_json::from_slice::<Vec<Value>>(&json).unwrap()
        })
        .collect()
}

/// The tree of `whole` holding only the first `keep` records of its log, as
/// if its process had died there, its owner gone.
pub(crate) fn cut_log(whole: &TreeDump, records: &[Value], keep: usize) -> TreeDump {
    let mut dump = whole.clone();
    let seq = records[..keep]
        .iter()
        .filter_map(|r| r["seq"].as_u64())
        .max()
        .unwrap_or(0);
    let json = serde_json::to_string(&records[..keep]).unwrap();
    dump.segments = vec![Segment {
        n: 1,
        body: lz4_flex::compress_prepend_size(json.as_bytes()),
    }];
    let row = &mut dump.row;
    row.status = TreeStatus::Running;
    row.finished_ms = None;
    row.error = None;
    row.owner = "-:0".into();
    row.heartbeat_ms = 0;
    row.last_seq = seq;
    row.segments = 1;
    dump
}

both_backends! {
    /// Resume is correct from any prefix of a tree's log (a batch is one
    /// transaction, so a crash leaves a prefix): cut the log of a finished tree
    /// after every event in turn, resume, and the root ends exactly as it did.
    /// The cuts include a scribe (inline, with its parent's toolbox) resumed from
    /// its checkpoint, and the boss started again (no checkpoint yet) meeting its
    /// finished inline scribe.
    fn a_tree_resumed_from_every_prefix_of_its_log_ends_as_it_did(backend) {
        let place = backend.fresh();
        let (whole, dump) = runtime().block_on(async {
            let store = place.open();
            let sup = boss_and_scribe(store.clone());
            let state = (*finish(start(&sup, "boss", "Report.").await).await.state).clone();
            sup.flush().await.unwrap();
            (state, store.dump(&as_tree("t")).unwrap())
        });
        assert_eq!(whole.status, AgentStatus::Completed);
        let records = dumped_records(&dump);
        let cuts: Vec<usize> = (0..records.len())
            .filter(|i| records[*i].get("seq").is_some())
            .map(|i| i + 1)
            .collect();
        assert!(cuts.len() > 20, "{} events", cuts.len());
        let mut checked = 0;
        for keep in cuts {
            let last = &records[keep - 1];
            let ended = last["type"] == "agentFinished" && last["runId"] == "t/0";
            if ended {
                continue;
            }
            let place = backend.fresh();
            let state = runtime().block_on(async {
                let store = place.open();
                store.load(&cut_log(&dump, &records, keep)).unwrap();
                let sup = boss_and_scribe(store);
                let result = finish(sup.resume(&as_tree("t")).await.unwrap()).await;
                (*result.state).clone()
            });
            assert_eq!(
                state, whole,
                "resumed after event {} ({} of {})",
                last["seq"], last["type"], last["runId"]
            );
            checked += 1;
        }
        println!("{checked} cuts resumed");
        assert!(checked >= 20, "{checked}");
    }
}

both_backends! {
/// A reader that follows a tree live and then (after a reconnect) from the
/// store sees one shape: every live event's `journal_view` equals the event the
/// store gives back, and the store has every one of them.
async fn live_events_seen_through_the_journal_view_equal_the_stored_ones(backend) {
    let place = backend.fresh();
    let store = place.open();
    let sup = boss_and_scribe(store.clone());
    let mut live = sup.events().subscribe_tree(&as_tree("t"));
    finish(start(&sup, "boss", "Report.").await).await;
    sup.flush().await.unwrap();
    let mut views = Vec::new();
    while let Ok(event) = live.try_recv() {
        if let Some(view) = arbor_supervisor::journal_view(&event) {
            views.push(view);
        }
    }
    let stored = store.events(&as_tree("t"), 0).unwrap();
    assert!(views.len() > 10, "only {} events", views.len());
    assert_eq!(views, stored);
    // Byte for byte, too: one shape either way.
    let text = |entries: &[arbor_supervisor::JournalEntry]| serde_json::to_string(entries).unwrap();
    assert_eq!(text(&views), text(&stored));
    let json: Vec<Value> = stored
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    let finished: Vec<&Value> = json
        .iter()
        .filter(|e| e["type"] == "agentFinished")
        .collect();
    assert_eq!(finished.len(), 2);
    assert!(
        finished
            .iter()
            .all(|e| e["status"] == "completed" && e.get("output").is_some())
    );
    // Resuming after any seq gives exactly the rest.
    for (i, entry) in stored.iter().enumerate() {
        assert_eq!(store.events(&as_tree("t"), entry.seq).unwrap(), stored[i + 1..].to_vec());
    }
}
}

both_backends! {
/// A remote stream reads the journal past its cursor (issue 16): only the
/// segments with events past it are read, and what comes back is exactly
/// the entries past `after`, whichever segment it falls in, the first and
/// the last included; a tree the store does not have is unknown.
fn the_journal_past_a_seq_is_exactly_the_entries_after_it(backend) {
    let place = backend.fresh();
    let store = place.open();
    store.write(&[record("t"), step("t", 1), step("t", 2)]).unwrap();
    // A segment per batch: 1-2, 3, 4-6, a heartbeat's none, 1048583 (a resume's jump).
    store.write(&[step("t", 3)]).unwrap();
    store.write(&[step("t", 4), step("t", 5), step("t", 6)]).unwrap();
    store.write(&[Write::Heartbeat(vec![as_tree("t")])]).unwrap();
    store.write(&[step("t", 1_048_583)]).unwrap();
    let all: Vec<u64> = store.events(&as_tree("t"), 0).unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(all, vec![1, 2, 3, 4, 5, 6, 1_048_583]);
    for after in [0, 1, 2, 3, 4, 5, 6, 7, 1_048_582, 1_048_583, u64::MAX / 2] {
        let want: Vec<u64> = all.iter().copied().filter(|s| *s > after).collect();
        let got: Vec<u64> = store.events(&as_tree("t"), after).unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(got, want, "after {after}");
    }
    assert!(matches!(
        store.events(&as_tree("nope"), 0),
        Err(arbor_supervisor::Error::UnknownTree(_))
    ));
    // A tree copied in (its segments' seqs not known there) reads the same.
    let elsewhere = backend.fresh();
    let other = elsewhere.open();
    other.load(&store.dump(&as_tree("t")).unwrap()).unwrap();
    assert_eq!(other.events(&as_tree("t"), 4).unwrap(), store.events(&as_tree("t"), 4).unwrap());
    // The first segment (seqs 1-2) is not read past it: broken, only a
    // read from before its end sees that.
    place.execute("UPDATE segments SET body = substr(body, 1, 0) WHERE tree_id = 't' AND n = 1");
    assert!(store.events(&as_tree("t"), 0).is_err());
    let got: Vec<u64> = store.events(&as_tree("t"), 2).unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(got, vec![3, 4, 5, 6, 1_048_583]);
}
}

both_backends! {
/// A shutting-down process hands its running trees over: once `release`
/// returns, the store lists them as interrupted although this process (their
/// owner) is alive, and resume can claim them at once.
async fn released_trees_are_interrupted_at_once_and_recorded_no_more(backend) {
    use arbor_actors::models::{Latency, SimulatedConfig, SimulatedModel};
    let place = backend.fresh();
    let store = place.open();
    let slow = SimulatedModel::new(
        "slow",
        SimulatedConfig {
            latency: Latency::Fixed(std::time::Duration::from_secs(3600)),
            ..SimulatedConfig::tree(2, 1)
        },
    );
    let catalog = Catalog::builder()
        .model(Arc::new(slow) as Arc<dyn Model>)
        .template(arbor_actors::AgentTemplate::new("boss", "slow"))
        .build()
        .unwrap();
    let sup = Supervisor::new(catalog, TreeLimits::default())
        .with_store(store.clone())
        .unwrap();
    let mut events = sup.events().subscribe_tree(&as_tree("t"));
    let handle = start(&sup, "boss", "wait").await;
    while events.recv().await.unwrap().kind.name() != "stepStarted" {}
    let interrupted = TreeFilter {
        status: Some(arbor_supervisor::TreeStatus::Interrupted),
        limit: 10,
        offset: 0,
    };
    assert!(store.trees(&interrupted).unwrap().is_empty());
    assert_eq!(sup.release().await.unwrap(), vec![as_tree("t")]);
    let listed = store.trees(&interrupted).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].tree_id, "t");
    // Nothing more is recorded for it: cancelling it here leaves it interrupted.
    handle.cancel();
    finish(handle).await;
    sup.flush().await.unwrap();
    assert_eq!(store.trees(&interrupted).unwrap().len(), 1);
}
}

both_backends! {
/// Events written in the same batch as a release (a server's trees keep
/// running while it hands them over) must not give the tree a fresh
/// heartbeat: a process started right after sees it interrupted at once.
fn a_tree_released_in_a_batch_with_its_events_stays_interrupted(backend) {
    use arbor_actors::{Event, EventKind};
    let place = backend.fresh();
    let store = place.open();
    let event = |seq: u64| {
        Write::Event(Arc::new(Event {
            seq,
            tree_id: "t".parse().unwrap(),
            run_id: "t/0".parse().unwrap(),
            at_ms: 1,
            kind: EventKind::StepStarted { step: seq as u32 },
        }))
    };
    store
        .write(&[Write::Tree(Box::new(TreeRecord {
            tree_id: as_tree("t"),
            root_run_id: rid("t/0"),
            agent: "boss".into(),
            prompt: "p".into(),
            params: None,
            model: None,
            limits: TreeLimits::default(),
            origin: None,
            config: None,
            history: None,
            started_ms: 1,
            principal: None,
            webhook: None,
        }))])
        .unwrap();
    store
        .write(&[event(1), Write::Release(vec![as_tree("t")]), event(2)])
        .unwrap();
    let interrupted = TreeFilter {
        status: Some(arbor_supervisor::TreeStatus::Interrupted),
        limit: 10,
        offset: 0,
    };
    let listed = store.trees(&interrupted).unwrap();
    assert_eq!(
        listed.len(),
        1,
        "the released tree is not listed as interrupted"
    );
    // A later heartbeat does not take it back either.
    store.write(&[Write::Heartbeat(vec![as_tree("t")])]).unwrap();
    assert_eq!(store.trees(&interrupted).unwrap().len(), 1);
}
}

fn record(tree: &str) -> Write {
    Write::Tree(Box::new(TreeRecord {
        tree_id: as_tree(tree),
        root_run_id: as_tree(tree).root(),
        agent: "a".into(),
        prompt: "p".into(),
        params: None,
        model: None,
        limits: TreeLimits::default(),
        origin: None,
        config: Some("[models]\n".into()),
        history: None,
        started_ms: 1,
        principal: None,
        webhook: None,
    }))
}

fn step(tree: &str, seq: u64) -> Write {
    use arbor_actors::{Event, EventKind};
    Write::Event(Arc::new(Event {
        seq,
        tree_id: tree.parse().unwrap(),
        run_id: (format!("{tree}/0")).parse().unwrap(),
        at_ms: 1,
        kind: EventKind::StepStarted { step: seq as u32 },
    }))
}

/// The segment numbers of a tree's log.
fn segments(store: &dyn Store, tree: &str) -> Vec<u64> {
    store
        .dump(&as_tree(tree))
        .unwrap()
        .segments
        .iter()
        .map(|s| s.n)
        .collect()
}

/// What its owner gone looks like (a crash out of sight): no live owner,
/// an old heartbeat.
fn abandon(place: &crate::backend::Place, tree: &str) {
    place.execute(&format!(
        "UPDATE trees SET owner = '-:1', heartbeat_ms = 0 WHERE tree_id = '{tree}'"
    ));
}

both_backends! {
    /// Split brain (issue 12, defect 12): a writer paused past its lease goes
    /// on writing after another took its tree over. Its batch for that tree is
    /// refused whole (no segment, no heartbeat, no release) and reported as
    /// fenced, the rest of the batch lands, and the new owner's log stays
    /// contiguous. On Postgres the two stores are two replicas on one database.
    fn an_older_epochs_batch_is_refused_and_nothing_of_it_lands(backend) {
        let place = backend.fresh();
        let old = place.open();
        assert!(
            old.write(&[record("t"), record("u"), step("t", 1), step("u", 1)])
                .unwrap()
                .is_empty()
        );
        abandon(&place, "t");
        let new = place.open();
        assert_eq!(new.claim(&as_tree("t")).unwrap(), 2, "the second claim of t");
        let owner = new.owner(&as_tree("t")).unwrap().expect("t is running under its new claim");
        assert_eq!(owner.epoch, 2);
        let fenced = old
            .write(&[
                step("t", 2),
                step("u", 2),
                Write::Heartbeat(vec![as_tree("t"), as_tree("u")]),
            ])
            .unwrap();
        assert_eq!(fenced.len(), 1, "{fenced:?}");
        assert_eq!(
            (fenced[0].tree_id.as_str(), fenced[0].epoch, fenced[0].current),
            ("t", 1, 2)
        );
        assert_eq!(fenced[0].owner, owner.owner);
        assert_eq!(segments(&*new, "t"), vec![1], "the fenced batch wrote to t");
        assert_eq!(segments(&*new, "u"), vec![1, 2], "u's writes were lost");
        let row = new.dump(&as_tree("t")).unwrap().row;
        assert_eq!(row.last_seq, 1);
        assert_eq!(row.heartbeat_ms, owner.heartbeat_ms, "the old owner's heartbeat landed");
        // Still refused later, and a release does not undo the new claim.
        let again = old
            .write(&[step("t", 3), Write::Release(vec![as_tree("t")])])
            .unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(segments(&*new, "t"), vec![1]);
        // The new owner writes on where the log ends: no clash of numbers.
        assert!(new.write(&[record("t"), step("t", 2)]).unwrap().is_empty());
        assert!(new.write(&[step("t", 3)]).unwrap().is_empty());
        assert_eq!(segments(&*new, "t"), vec![1, 2, 3]);
        assert_eq!(new.events(&as_tree("t"), 0).unwrap().len(), 3);
        let row = new.dump(&as_tree("t")).unwrap().row;
        assert_eq!((row.status, row.owner), (TreeStatus::Running, owner.owner));
    }
}

both_backends! {
    /// A new tree that lands on a stored id holds no claim: it takes nothing
    /// over, and is reported fenced out.
    fn a_new_tree_on_a_stored_id_is_fenced_out(backend) {
        let place = backend.fresh();
        let first = place.open();
        first.write(&[record("t"), step("t", 1)]).unwrap();
        let second = place.open();
        let fenced = second.write(&[record("t"), step("t", 1)]).unwrap();
        assert_eq!(fenced.len(), 1);
        assert_eq!((fenced[0].epoch, fenced[0].current), (0, 1));
        assert_eq!(segments(&*first, "t"), vec![1]);
        assert!(first.write(&[step("t", 2)]).unwrap().is_empty());
    }
}

both_backends! {
    /// The control inbox: posted for a tree, taken by its owner oldest first,
    /// once; a tree the store does not have is refused by name.
    fn controls_are_taken_oldest_first_and_only_once(backend) {
        let place = backend.fresh();
        let store = place.open();
        store.write(&[record("t"), record("u")]).unwrap();
        let a = store.post_control(&as_tree("t"), &json!({"cancel": true})).unwrap();
        let b = store.post_control(&as_tree("u"), &json!({"steer": "left"})).unwrap();
        let c = store.post_control(&as_tree("t"), &json!({"approve": "call-1"})).unwrap();
        assert!(a < b && b < c, "{a} {b} {c}");
        let unknown = store.post_control(&as_tree("nope"), &json!({}));
        assert!(
            matches!(&unknown, Err(arbor_supervisor::Error::UnknownTree(t)) if t == "nope"),
            "{unknown:?}"
        );
        let taken = store.take_controls(&[as_tree("t")]).unwrap();
        let ids: Vec<u64> = taken.iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![a, c]);
        assert_eq!(taken[0].body, json!({"cancel": true}));
        assert_eq!(taken[1].tree_id, "t");
        assert!(store.take_controls(&[as_tree("t")]).unwrap().is_empty());
        // Another process (replica) on the same data takes u's.
        let other = place.open();
        let taken = other.take_controls(&[as_tree("t"), as_tree("u")]).unwrap();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].body, json!({"steer": "left"}));
    }
}

both_backends! {
    /// Two owners taking the same trees' controls at once (a replica and the
    /// one that adopts its trees): every control is taken exactly once.
    fn concurrent_takers_take_each_control_exactly_once(backend) {
        let place = backend.fresh();
        let store = place.open();
        store.write(&[record("t")]).unwrap();
        let posted: Vec<u64> = (0..200)
            .map(|i| store.post_control(&as_tree("t"), &json!({"n": i})).unwrap())
            .collect();
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let store = place.open();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    for _ in 0..50 {
                        got.extend(store.take_controls(&[as_tree("t")]).unwrap());
                    }
                    got
                })
            })
            .collect();
        let mut seen: Vec<u64> = takers
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .map(|c| c.id)
            .collect();
        seen.extend(store.take_controls(&[as_tree("t")]).unwrap().iter().map(|c| c.id));
        seen.sort();
        assert_eq!(seen, posted, "a control was lost or taken twice");
    }
}

both_backends! {
    /// `owner` names a running tree's owner and claim, and nobody once the
    /// tree ended or its owner is gone.
    fn the_owner_of_a_tree_is_known_while_it_runs(backend) {
        let place = backend.fresh();
        let store = place.open();
        store.write(&[record("t")]).unwrap();
        let owner = store.owner(&as_tree("t")).unwrap().expect("t runs here");
        assert_eq!(owner.epoch, 1);
        assert!(owner.heartbeat_ms > 0);
        abandon(&place, "t");
        assert_eq!(store.owner(&as_tree("t")).unwrap(), None);
        assert!(matches!(
            store.owner(&as_tree("nope")),
            Err(arbor_supervisor::Error::UnknownTree(_))
        ));
    }
}

both_backends! {
    /// Adoption claims many interrupted trees at once (issue 16: a replica's
    /// SIGTERM hands 200 trees over within 2 s): every interrupted one of
    /// those asked for is claimed under its next epoch, and those that run,
    /// ended or are unknown are left out without an error; the claimant
    /// writes them, their old owner is fenced out, and their records and
    /// recoveries are read back together.
    fn interrupted_trees_are_claimed_together_and_the_others_left_out(backend) {
        let place = backend.fresh();
        let old = place.open();
        old.write(&[record("t"), record("u"), record("v"), record("w"), step("t", 3)])
            .unwrap();
        abandon(&place, "t");
        abandon(&place, "u");
        abandon(&place, "w");
        place.execute("UPDATE trees SET status = 'completed' WHERE tree_id = 'w'");
        let new = place.open();
        let ids = |v: &[&str]| v.iter().map(|s| as_tree(s)).collect::<Vec<_>>();
        let claimed = new
            .claim_interrupted(&ids(&["u", "v", "w", "nope", "t"]))
            .unwrap();
        assert_eq!(claimed, vec![(as_tree("u"), 2), (as_tree("t"), 2)], "v runs, w ended");
        assert!(new.claim_interrupted(&ids(&["t", "u"])).unwrap().is_empty(), "claimed once");
        assert_eq!(new.owner(&as_tree("t")).unwrap().expect("t runs under its new claim").epoch, 2);
        // The claimant holds them; their old owner is fenced out.
        assert!(new.write(&[step("t", 4), step("u", 1)]).unwrap().is_empty());
        let fenced = old.write(&[step("t", 5), step("v", 1)]).unwrap();
        assert_eq!(fenced.len(), 1, "{fenced:?}");
        assert_eq!((fenced[0].tree_id.as_str(), fenced[0].current), ("t", 2));
        let read = new.resumes(&ids(&["t", "nope", "u"])).unwrap();
        assert_eq!(read.len(), 3);
        let (record, recovery) = read[0].as_ref().unwrap();
        assert_eq!((record.tree_id.as_str(), recovery.last_seq), ("t", 4));
        assert_eq!(record.config.as_deref(), Some("[models]\n"));
        assert!(matches!(&read[1], Err(arbor_supervisor::Error::UnknownTree(t)) if t == "nope"));
        assert_eq!(read[2].as_ref().unwrap().0.tree_id, "u");
        assert_eq!(new.status(&as_tree("w")).unwrap(), TreeStatus::Completed);
        assert_eq!(new.status(&as_tree("t")).unwrap(), TreeStatus::Running);
        assert!(matches!(new.status(&as_tree("nope")), Err(arbor_supervisor::Error::UnknownTree(_))));
    }
}

both_backends! {
    /// Two replicas adopting the same interrupted trees at once: every tree
    /// is claimed by exactly one of them.
    fn two_adopters_at_once_claim_each_tree_exactly_once(backend) {
        let place = backend.fresh();
        let old = place.open();
        let trees: Vec<TreeId> = (0..60).map(|i| as_tree(&format!("t{i:02}"))).collect();
        let records: Vec<Write> = trees.iter().map(|t| record(t)).collect();
        old.write(&records).unwrap();
        place.execute("UPDATE trees SET owner = '-:1', heartbeat_ms = 0");
        let adopters: Vec<_> = (0..2)
            .map(|_| {
                let store = place.open();
                let trees = trees.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    for chunk in trees.chunks(7) {
                        got.extend(store.claim_interrupted(chunk).unwrap());
                    }
                    got
                })
            })
            .collect();
        let mut seen: Vec<TreeId> = adopters
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .map(|(tree, epoch)| {
                assert_eq!(epoch, 2, "{tree}");
                tree
            })
            .collect();
        // What one skipped (the other held it a moment) is claimed now.
        seen.extend(old.claim_interrupted(&trees).unwrap().into_iter().map(|(t, _)| t));
        seen.sort();
        let unique: std::collections::BTreeSet<&TreeId> = seen.iter().collect();
        assert_eq!(unique.len(), seen.len(), "a tree claimed twice");
        assert_eq!(seen, trees, "a tree nobody claimed");
    }
}

/// A finished tree (with a config, checkpoints, replies, an inline child)
/// in a fresh store of `backend`, and that store's place.
fn finished_tree(backend: Backend) -> (crate::backend::Place, Arc<dyn Store>) {
    let place = backend.fresh();
    let store = place.open();
    runtime().block_on(async {
        let sup = boss_and_scribe(store.clone());
        let mut request = request("boss", "Report.");
        request.config = Some(Arc::from("[agents.boss]\n"));
        finish(sup.start(request).await.unwrap()).await;
        sup.flush().await.unwrap();
    });
    (place, store)
}

/// `arbor store copy` both ways: a tree moved SQLite → Postgres → SQLite is
/// the same tree (the same export, row and log, byte for byte), and
/// resumable claims go on from its epoch; copying onto a stored id is refused.
#[test]
fn a_tree_copied_sqlite_to_postgres_and_back_exports_the_same() {
    use arbor_supervisor::store::copy_tree;
    let (_a, sqlite) = finished_tree(Backend::Sqlite);
    let pg_place = Backend::Postgres.fresh();
    let pg = pg_place.open();
    copy_tree(&*sqlite, &*pg, &as_tree("t")).unwrap();
    let back_place = Backend::Sqlite.fresh();
    let back = back_place.open();
    copy_tree(&*pg, &*back, &as_tree("t")).unwrap();
    let original = sqlite.export(&as_tree("t")).unwrap();
    assert!(
        original["tree"]["config"].is_string(),
        "{}",
        original["tree"]
    );
    assert_eq!(pg.export(&as_tree("t")).unwrap(), original);
    assert_eq!(back.export(&as_tree("t")).unwrap(), original);
    assert_eq!(
        back.dump(&as_tree("t")).unwrap(),
        sqlite.dump(&as_tree("t")).unwrap()
    );
    assert_eq!(
        pg.dump(&as_tree("t")).unwrap(),
        sqlite.dump(&as_tree("t")).unwrap()
    );
    assert_eq!(
        pg.trees(&TreeFilter::default()).unwrap(),
        sqlite.trees(&TreeFilter::default()).unwrap()
    );
    // The next turn's claim goes on from the copied epoch.
    let epoch = sqlite.dump(&as_tree("t")).unwrap().row.epoch;
    assert_eq!(pg.claim_turn(&as_tree("t")).unwrap(), epoch + 1);
    let again = copy_tree(&*sqlite, &*pg, &as_tree("t"));
    assert!(
        matches!(&again, Err(arbor_supervisor::Error::TreeStored(t)) if t == "t"),
        "{again:?}"
    );
}

/// Issue 33: `arbor store copy` of a tree with follow-up turns waiting left
/// them behind, so the copy never ran them. They come along, in order, with
/// their turn numbers (the runs they will be), both ways.
#[test]
fn a_copied_tree_keeps_the_turns_queued_for_it() {
    use arbor_supervisor::store::copy_tree;
    let (_a, sqlite) = finished_tree(Backend::Sqlite);
    let params = serde_json::json!({"n": 2});
    sqlite
        .queue_turn(&as_tree("t"), "First.", None, None, 16)
        .unwrap();
    sqlite
        .queue_turn(
            &as_tree("t"),
            "Second.",
            Some(&params),
            Some("https://hooks.example.com/turn"),
            16,
        )
        .unwrap();
    let pg_place = Backend::Postgres.fresh();
    let pg = pg_place.open();
    copy_tree(&*sqlite, &*pg, &as_tree("t")).unwrap();
    let back_place = Backend::Sqlite.fresh();
    let back = back_place.open();
    copy_tree(&*pg, &*back, &as_tree("t")).unwrap();
    type Seen = (
        u32,
        String,
        Option<serde_json::Value>,
        usize,
        Option<String>,
    );
    let what = |store: &Arc<dyn Store>| -> Vec<Seen> {
        store
            .queued_turns(&as_tree("t"))
            .unwrap()
            .into_iter()
            .map(|q| (q.turn, q.prompt, q.params, q.position, q.webhook))
            .collect()
    };
    let original = what(&sqlite);
    assert_eq!(original.len(), 2, "{original:?}");
    // A turn's webhook waits with it.
    assert_eq!(
        original[1].4.as_deref(),
        Some("https://hooks.example.com/turn")
    );
    assert_eq!(what(&pg), original);
    assert_eq!(what(&back), original);
}

/// A supervisor whose `chat` agent answers a first turn and a turn asked
/// "second question".
fn chat(store: Arc<dyn Store>) -> Supervisor {
    let model = scripted(json!({"replies": [
        {"agent": "chat", "prompt": "second", "steps": [{"text": "second answer"}]},
        {"agent": "chat", "steps": [{"text": "first answer"}]}
    ]}));
    let catalog = Catalog::builder()
        .model(model as Arc<dyn Model>)
        .template(template("chat"))
        .build()
        .unwrap();
    Supervisor::new(catalog, TreeLimits::default())
        .with_store(store)
        .unwrap()
}

both_backends! {
    /// Issue 33: a process that died between claiming an ended tree for its
    /// queued turn and writing that turn's first record left the tree
    /// running under a dead owner with its last turn ended. The process that
    /// adopts it ends it again, and the turn, still queued, runs.
    fn a_queued_turn_claimed_by_a_process_that_died_before_starting_it_still_runs(backend) {
        let place = backend.fresh();
        runtime().block_on(async {
            let sup = chat(place.open());
            finish(sup.start(request("chat", "first question")).await.unwrap()).await;
            sup.flush().await.unwrap();
        });
        let store = place.open();
        store
            .queue_turn(&as_tree("t"), "second question", None, None, 16)
            .unwrap();
        // The process that takes the turn dies before its run starts.
        assert!(store.take_turn(&as_tree("t"), None).unwrap().is_some());
        abandon(&place, "t");
        runtime().block_on(async {
            let sup = chat(place.open());
            for (tree, adopted) in sup.adopt(vec![as_tree("t")], |_| {}).await.unwrap() {
                match adopted {
                    Ok(handle) => drop(finish(handle).await),
                    Err(error) => eprintln!("{tree} not adopted: {error}"),
                }
            }
            sup.until_ended(&as_tree("t")).await;
            let (turn, handle) = sup
                .next_turn(&as_tree("t"), None)
                .await
                .unwrap()
                .expect("the queued turn is taken");
            assert_eq!(turn.run_id(), "t/0~1");
            let ran = finish(handle).await;
            assert_eq!(ran.state.run_id, "t/0~1");
            assert_eq!(ran.state.message_history.last().unwrap().text(), "second answer");
            sup.flush().await.unwrap();
        });
        assert!(place.open().queued_turns(&as_tree("t")).unwrap().is_empty());
    }
}

/// Two replicas on one database resuming one interrupted tree at once: one
/// claim wins, the other is refused because the winner now runs it.
#[test]
fn two_replicas_claiming_one_tree_at_once_one_wins() {
    for round in 0..5 {
        let place = Backend::Postgres.fresh();
        place.open().write(&[record("t")]).unwrap();
        abandon(&place, "t");
        let replicas: Vec<Arc<dyn Store>> = (0..2).map(|_| place.open()).collect();
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let claims: Vec<_> = replicas
            .iter()
            .map(|r| {
                let (r, barrier) = (r.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    r.claim(&as_tree("t"))
                })
            })
            .collect();
        let results: Vec<_> = claims.into_iter().map(|c| c.join().unwrap()).collect();
        let won: Vec<u64> = results
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        assert_eq!(won, vec![2], "round {round}: {results:?}");
        let lost = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert!(
            matches!(lost, arbor_supervisor::Error::NotResumable { .. }),
            "round {round}: {lost:?}"
        );
    }
}

/// The fence is the database's: a write that names a stale epoch applies
/// nothing even when the writer's own check is passed by (the row's epoch
/// moved between the writer's claim and its statement).
#[test]
fn the_database_refuses_a_segment_of_a_stale_epoch() {
    let place = Backend::Postgres.fresh();
    let store = place.open();
    store.write(&[record("t"), step("t", 1)]).unwrap();
    // What a writer that skipped its check would send, epoch 1 against 2.
    place.execute("UPDATE trees SET epoch = 2 WHERE tree_id = 't'");
    place.execute(
        "INSERT INTO segments(tree_id, n, body)
         SELECT s.tree_id, s.n, s.body
         FROM (VALUES ('t', 2::BIGINT, '\\x00'::BYTEA, 1::BIGINT)) AS s(tree_id, n, body, epoch)
         WHERE s.epoch IS NULL
            OR EXISTS (SELECT 1 FROM trees t WHERE t.tree_id = s.tree_id AND t.epoch = s.epoch)",
    );
    assert_eq!(segments(&*store, "t"), vec![1]);
    // And the store itself reports the batch fenced.
    let fenced = store.write(&[step("t", 2)]).unwrap();
    assert_eq!((fenced[0].epoch, fenced[0].current), (1, 2));
    assert_eq!(segments(&*store, "t"), vec![1]);
}

/// Migrations are versioned and idempotent, and replicas that start at
/// once do not race (the advisory lock): eight openers of one empty
/// database all succeed, and migrating again changes nothing. A database
/// without the schema is refused by `open_existing`, and one of a newer
/// schema by every opener.
#[test]
fn migrations_run_once_under_concurrent_openers_and_a_newer_schema_is_refused() {
    let place = Backend::Postgres.fresh();
    let refused = PgStore::open_existing(&place.at).unwrap_err().to_string();
    assert!(refused.contains("no Arbor store"), "{refused}");
    let barrier = Arc::new(std::sync::Barrier::new(8));
    let openers: Vec<_> = (0..8)
        .map(|_| {
            let (url, barrier) = (place.at.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                PgStore::open(&url).map(drop)
            })
        })
        .collect();
    for opener in openers {
        opener.join().unwrap().unwrap();
    }
    let report = PgStore::migrate(&place.at).unwrap();
    assert_eq!(report.from, report.to);
    PgStore::open_existing(&place.at).unwrap();
    place.execute(&format!(
        "INSERT INTO arbor_schema(version, applied_ms) VALUES ({}, 0)",
        report.to + 1
    ));
    for refused in [
        PgStore::open(&place.at).unwrap_err(),
        PgStore::open_existing(&place.at).unwrap_err(),
    ] {
        assert!(
            matches!(refused, arbor_supervisor::Error::NewerStore { found, .. } if found == report.to + 1),
            "{refused:?}"
        );
    }
}

/// The password never shows: not in an error (a wrong password, an
/// unreachable server), not in the store's Debug. A URL without one takes it
/// from `ARBOR_PG_PASSWORD`.
#[test]
fn the_password_is_never_shown() {
    let place = Backend::Postgres.fresh();
    let secret = "pw-Zq81-secret";
    let with_password = place
        .at
        .replacen("://arbor@", &format!("://arbor:{secret}@"), 1);
    assert!(with_password.contains(secret), "{with_password}");
    // The test server trusts loopback: the password is not checked, and
    // must not show in the store's Debug or URL.
    let store = PgStore::open(&with_password).unwrap();
    let shown = format!("{store:?} {}", store.url());
    assert!(!shown.contains(secret), "{shown}");
    assert!(shown.contains("***"), "{shown}");
    // An unreachable server and a database that does not exist.
    let closed = format!("postgres://arbor:{secret}@127.0.0.1:1/x?connect_timeout=2");
    let missing = with_password.rsplit_once('/').unwrap().0.to_owned() + "/no_such_database_here";
    for url in [closed, missing] {
        let error = PgStore::open(&url).unwrap_err();
        let text = format!("{error} {error:?}");
        assert!(!text.contains(secret), "the password shows: {text}");
        assert!(text.contains("***"), "the URL is not named: {text}");
    }
}

/// A follower's wake-up: a batch's commit sends `arbor_journal` with the
/// tree and its last seq, and a control `arbor_control`, to every
/// subscriber on the database (another replica included).
#[test]
fn a_wake_up_arrives_after_a_batch_commits() {
    use arbor_supervisor::store::Wake;
    use std::time::Duration;
    let place = Backend::Postgres.fresh();
    let writer = place.open();
    let follower = place.open();
    let wakes = follower
        .subscribe()
        .unwrap()
        .expect("Postgres has wake-ups");
    writer
        .write(&[record("t"), step("t", 1), step("t", 7)])
        .unwrap();
    let wake = wakes.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        wake,
        Wake::Journal {
            tree_id: "t".into(),
            seq: 7
        }
    );
    writer
        .post_control(&as_tree("t"), &json!({"cancel": true}))
        .unwrap();
    let wake = wakes.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        wake,
        Wake::Control {
            tree_id: "t".into()
        }
    );
    // A heartbeat alone wakes nobody.
    writer
        .write(&[Write::Heartbeat(vec![as_tree("t")])])
        .unwrap();
    assert!(wakes.recv_timeout(Duration::from_millis(300)).is_err());
    // A release (a shutdown's hand-over) wakes the adopters.
    writer.write(&[Write::Release(vec![as_tree("t")])]).unwrap();
    let wake = wakes.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(wake, Wake::Released { trees: 1 });
    // SQLite has none: its followers poll.
    assert!(
        Backend::Sqlite
            .fresh()
            .open()
            .subscribe()
            .unwrap()
            .is_none()
    );
}

both_backends! {
/// One batch that fills several segments of two trees (each full one is
/// packed as it closes, its buffer going on with the next): each tree's
/// segments are numbered 1, 2, 3 in order, and its journal reads back whole
/// and in order, from the start and past a seq inside a closed segment.
fn a_batch_of_many_full_segments_reads_back_in_order(backend) {
    use arbor_actors::{Event, EventKind};
    let place = backend.fresh();
    let store = place.open();
    let big = |tree: &str, seq: u64| {
        Write::Event(Arc::new(Event {
            seq,
            tree_id: tree.parse().unwrap(),
            run_id: (format!("{tree}/0")).parse().unwrap(),
            at_ms: 1,
            kind: EventKind::OutputSet {
                output: json!(words(100_000, seq)),
            },
        }))
    };
    // 100 KB an event, a segment closed past 256 KiB: three events each.
    let mut batch = vec![record("t"), record("u")];
    for seq in 1..=7 {
        batch.push(big("t", seq));
        batch.push(big("u", seq));
    }
    store.write(&batch).unwrap();
    for tree in ["t", "u"] {
        assert_eq!(segments(&*store, tree), vec![1, 2, 3], "{tree}");
        let read: Vec<u64> = store.events(&as_tree(tree), 0).unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(read, (1..=7).collect::<Vec<u64>>(), "{tree}");
        let past: Vec<u64> = store.events(&as_tree(tree), 2).unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(past, (3..=7).collect::<Vec<u64>>(), "{tree}");
        let first = &store.events(&as_tree(tree), 0).unwrap()[0];
        assert_eq!(first.get("output"), Some(&json!(words(100_000, 1))));
    }
}
}

both_backends! {
    /// A child's first record starts from its parent's last checkpoint: it
    /// lists the messages it added, not again the ids of every message it
    /// inherited (a hundred of them each, in the agent trees of BENCHMARKS.md),
    /// and every stored state reads back as the run ended.
    fn a_childs_first_checkpoint_names_its_parent_and_lists_only_what_it_added(backend) {
        let place = backend.fresh();
        let model = scripted(json!({"replies": [
            {"agent": "lead", "steps": [
                {"text": "Noting first.", "toolCalls": [
                    {"name": "echo", "input": {"n": 1}}, {"name": "echo", "input": {"n": 2}},
                    {"name": "echo", "input": {"n": 3}}, {"name": "echo", "input": {"n": 4}}
                ]},
                {"text": "Delegating.", "toolCalls": [spawn_call(&[("reader", "one"), ("reader", "two")])]},
                {"text": "Done."}
            ]},
            {"agent": "reader", "steps": [{"text": "Read."}]}
        ]}));
        let mut reader = template("reader");
        reader.include_message_history = true;
        let catalog = Catalog::builder()
            .model(model as Arc<dyn Model>)
            .tool(echo() as Arc<dyn Tool>)
            .template(with_echo(template("lead")).spawns(&["reader"]))
            .template(reader)
            .build()
            .unwrap();
        let (events, dump, stored) = runtime().block_on(async {
            let store = place.open();
            let sup = Supervisor::new(catalog, TreeLimits::default())
                .with_store(store.clone())
                .unwrap();
            let (result, events) = run(&sup, "lead", "Read it.").await;
            assert_eq!(result.state.status, AgentStatus::Completed);
            sup.flush().await.unwrap();
            (events, store.dump(&as_tree("t")).unwrap(), store.final_states(&as_tree("t")).unwrap())
        });
        let live = final_states(&events);
        let readers: Vec<&Arc<AgentState>> = live
            .values()
            .filter(|s| s.agent_type.as_deref() == Some("reader"))
            .collect();
        assert_eq!(readers.len(), 2);
        let records = dumped_records(&dump);
        for child in &readers {
            let first = records
                .iter()
                .find(|r| r["c"] == child.run_id.to_string())
                .expect("a checkpoint of the child");
            assert_eq!(first["from"], "t/0", "{first}");
            let added = first["a"].as_array().unwrap().len();
            let kept = first["k"].as_u64().unwrap() as usize;
            // Kept: the prompt, the reply with 4 calls and their 4 results.
            // Added: the parent's spawn reply without its unfinished call (a
            // new message), the spawn notice, the prompt and the answer.
            assert_eq!((kept, added), (6, 4), "{first}");
            assert_eq!(kept + added, child.message_history.len(), "{first}");
        }
        assert_eq!(stored.len(), live.len());
        for state in stored {
            assert_eq!(&state, &*live[&state.run_id], "{} reads back as it ended", state.run_id);
        }
    }
}

/// A tool that answers how many replies of its run the store holds when it
/// starts (its call's own reply among them, if stored by then).
struct Witness {
    store: Arc<dyn Store>,
}

#[arbor_actors::tool::async_trait]
impl Tool for Witness {
    fn name(&self) -> &str {
        "touch"
    }
    fn description(&self) -> &str {
        "Counts the stored replies of its run."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(
        &self,
        _input: Value,
        ctx: arbor_actors::ToolContext,
    ) -> Result<arbor_actors::ToolOutput, arbor_actors::ToolError> {
        let stored = self
            .store
            .events(&ctx.tree_id, 0)
            .map_err(|e| arbor_actors::ToolError::new(e.to_string()))?
            .iter()
            .filter(|e| {
                e.kind == arbor_actors::EventType::ModelResponded
                    && *e.run_id == *ctx.run_id.to_string()
            })
            .count();
        Ok(arbor_actors::ToolOutput::Json(json!(stored)))
    }
}

/// The symptom: a process killed just after an agent edited a file could
/// have stored neither the edit's call nor the read before it (the writer
/// commits every few milliseconds), so the resumed run read its own edit
/// and its history no longer matched a replay. A tool call that may change
/// something now starts only once its tree's events before it are stored:
/// at each call the store already holds the reply that made it, and every
/// reply before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_changes_something_starts_only_once_the_reply_that_called_it_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("w.db")).unwrap());
    let touch = |n| json!({"toolCalls": [{"name": "touch", "input": {"n": n}}]});
    let mut steps: Vec<Value> = (0..5).map(touch).collect();
    steps.push(json!({"text": "done"}));
    let mut hand = template("hand").max_steps(20);
    hand.tools = vec!["touch".into()];
    let catalog = Catalog::builder()
        .model(scripted(json!({"replies": [{"agent": "hand", "steps": steps}]})) as Arc<dyn Model>)
        .tool(Arc::new(Witness {
            store: store.clone(),
        }) as Arc<dyn Tool>)
        .template(hand)
        .build()
        .unwrap();
    let sup = Supervisor::new(catalog, TreeLimits::default())
        .with_store(store.clone())
        .unwrap();
    let result = finish(start(&sup, "hand", "Touch five times.").await).await;
    assert_eq!(
        result.state.status,
        AgentStatus::Completed,
        "{:?}",
        result.state.error_message()
    );
    let seen: Vec<Value> = tool_results(&result.state, "touch");
    assert_eq!(seen, (1..=5).map(|n| json!(n)).collect::<Vec<_>>());
}

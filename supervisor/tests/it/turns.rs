//! Follow-up turns (semantics §14): an ended tree gets a new prompt; its
//! root goes on from its final state as run `T/0~n` of the same agent.

use std::sync::Arc;

use arbor_actors::{AgentStatus, Model, Tool};
use arbor_supervisor::store::{SqliteStore, Store};
use arbor_supervisor::{
    Catalog, Error, Supervisor, TreeHandle, TreeLimits, TreeStatus, TurnRequest, TurnStart,
};
use serde_json::json;

use crate::common::*;

fn chat(store: Arc<SqliteStore>) -> Supervisor {
    // Matched by the turn's prompt (the last one the root was given).
    let model = scripted(json!({"replies": [
        {"agent": "chat", "prompt": "second", "steps": [{"text": "second answer"}]},
        {"agent": "chat", "prompt": "third", "steps": [
            {"toolCalls": [spawn_call(&[("helper", "look it up")])]},
            {"text": "third answer"}
        ]},
        {"agent": "chat", "steps": [{"text": "first answer"}]},
        {"agent": "helper", "steps": [{"text": "looked up"}]}
    ]}));
    let catalog = Catalog::builder()
        .model(model as Arc<dyn Model>)
        .tool(echo() as Arc<dyn Tool>)
        .template(template("chat").spawns(&["helper"]))
        .template(template("helper"))
        .build()
        .unwrap();
    Supervisor::new(catalog, TreeLimits::default())
        .with_store(store)
        .unwrap()
}

/// A turn of an ended tree starts at once.
async fn turn(sup: &Supervisor, tree: &str, prompt: &str) -> Result<TreeHandle, Error> {
    match sup
        .start_turn(&as_tree(tree), TurnRequest::new(prompt))
        .await?
    {
        TurnStart::Started(handle) => Ok(handle),
        TurnStart::Queued(q) => panic!("queued, not started: {:?}", q.turn),
    }
}

fn texts(state: &arbor_actors::AgentState) -> Vec<String> {
    state.message_history.iter().map(|m| m.text()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_tree_takes_follow_up_turns_from_its_roots_final_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.db")).unwrap());
    let sup = chat(store.clone());
    let first = finish(start(&sup, "chat", "first question").await).await;
    assert_eq!(texts(&first.state), ["first question", "first answer"]);

    let handle = turn(&sup, "t", "second question").await.unwrap();
    assert_eq!(handle.root_run_id, "t/0~1", "a new run of the same agent");
    let second = finish(handle).await;
    assert_eq!(second.state.agent_id, "t/0");
    assert_eq!(
        texts(&second.state),
        [
            "first question",
            "first answer",
            "second question",
            "second answer"
        ]
    );
    // A third turn spawns as usual, its children under its own run id.
    let third = finish(turn(&sup, "t", "third question").await.unwrap()).await;
    assert_eq!(third.state.run_id, "t/0~2");
    assert_eq!(third.state.child_run_ids, ["t/0~2.1"]);
    assert_eq!(texts(&third.state).last().unwrap(), "third answer");
    sup.flush().await.unwrap();
    let (record, summary) = store.tree(&as_tree("t")).unwrap();
    assert_eq!(summary.status, TreeStatus::Completed);
    assert_eq!(record.root_run_id, "t/0~2");
    // Every turn's root is on record.
    let roots: Vec<String> = store
        .runs(&as_tree("t"))
        .unwrap()
        .into_iter()
        .filter(|n| n.depth == 0)
        .map(|n| n.run_id)
        .collect();
    for root in ["t/0", "t/0~1", "t/0~2"] {
        assert!(roots.iter().any(|r| r == root), "{root} in {roots:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_of_a_running_an_unknown_or_a_storeless_tree_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.db")).unwrap());
    let sup = chat(store);
    assert!(matches!(
        sup.start_turn(&as_tree("nope"), TurnRequest::new("hi")).await,
        Err(Error::UnknownTree(t)) if t == "nope"
    ));
    let handle = start(&sup, "chat", "first question").await;
    // Still running (or just ended): a turn of a running tree is refused
    // when the request says `reject`.
    if sup.is_running(&as_tree("t")) {
        let reject = TurnRequest {
            multitask: arbor_supervisor::Multitask::Reject,
            ..TurnRequest::new("again")
        };
        assert!(matches!(
            sup.start_turn(&as_tree("t"), reject).await,
            Err(Error::TurnRunning { .. }) | Ok(TurnStart::Started(_))
        ));
    }
    let result = finish(handle).await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    let storeless = Supervisor::new(
        Catalog::builder()
            .model(scripted(json!({"replies": []})) as Arc<dyn Model>)
            .template(template("chat"))
            .build()
            .unwrap(),
        TreeLimits::default(),
    );
    assert!(matches!(
        storeless
            .start_turn(&as_tree("t"), TurnRequest::new("hi"))
            .await,
        Err(Error::NoStore { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_turn_is_followed_by_the_next_from_its_partial_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.db")).unwrap());
    let model = scripted(json!({"replies": [
        {"agent": "chat", "prompt": "slow", "steps": [{"text": "slow answer", "delayMs": 60000}]},
        {"agent": "chat", "steps": [{"text": "answer"}]}
    ]}));
    let catalog = Catalog::builder()
        .model(model as Arc<dyn Model>)
        .template(template("chat"))
        .build()
        .unwrap();
    let sup = Supervisor::new(catalog, TreeLimits::default())
        .with_store(store)
        .unwrap();
    let mut rx = sup.subscribe();
    let mut seen = Vec::new();
    let handle = start(&sup, "chat", "slow").await;
    wait_for(&mut rx, &mut seen, |e| {
        matches!(e.kind, arbor_actors::EventKind::StepStarted { .. })
    })
    .await;
    // As a server does: the handle waits on a task of its own.
    let kept = tokio::spawn(async move { handle.wait().await });
    assert!(sup.cancel_tree(&as_tree("t")));
    sup.until_ended(&as_tree("t")).await;
    let cancelled = kept.await.unwrap().unwrap();
    assert_eq!(cancelled.state.status, AgentStatus::Cancelled);
    assert!(!sup.is_running(&as_tree("t")));
    let next = finish(turn(&sup, "t", "go on").await.unwrap()).await;
    assert_eq!(texts(&next.state), ["slow", "go on", "answer"]);
}

crate::backend::both_backends! {
    /// Turns asked while a turn runs are queued in the store, numbered and
    /// placed in line, bounded, journaled, refused for `reject`, and taken
    /// one at a time, in order, each once its predecessor has ended.
    async fn turns_asked_while_one_runs_are_queued_and_taken_in_order(backend) {
        use arbor_supervisor::{Multitask, TurnStart};
        let place = backend.fresh();
        let store = place.open();
        let model = scripted(json!({"replies": [
            {"agent": "chat", "prompt": "slow",
             "steps": [{"text": "slow answer", "delayMs": 600000}]},
            {"agent": "chat", "steps": [{"text": "answer"}]}
        ]}));
        let catalog = Catalog::builder()
            .model(model as Arc<dyn Model>)
            .template(template("chat"))
            .build()
            .unwrap();
        let sup = Supervisor::new(catalog, TreeLimits::default())
            .with_store(store.clone())
            .unwrap()
            .with_turn_queue_limit(2);
        let mut rx = sup.subscribe();
        let mut seen = Vec::new();
        let handle = start(&sup, "chat", "slow").await;
        wait_for(&mut rx, &mut seen, |e| {
            matches!(e.kind, arbor_actors::EventKind::StepStarted { .. })
        })
        .await;
        let kept = tokio::spawn(async move { handle.wait().await });
        let ask = |prompt: &str, multitask| TurnRequest {
            multitask,
            ..TurnRequest::new(prompt)
        };
        let queued = |started: TurnStart| match started {
            TurnStart::Queued(q) => q,
            TurnStart::Started(h) => panic!("started {}", h.root_run_id),
        };
        let one = queued(sup.start_turn(&as_tree("t"), ask("one", Multitask::Enqueue)).await.unwrap());
        assert_eq!((one.turn.run_id().to_string().as_str(), one.turn.position, one.here), ("t/0~1", 1, true));
        assert!(matches!(
            sup.start_turn(&as_tree("t"), ask("no", Multitask::Reject)).await,
            Err(Error::TurnRunning { .. })
        ));
        // Params that do not fit are refused before anything is queued.
        let bad = TurnRequest { params: Some(json!([1])), ..TurnRequest::new("bad") };
        assert!(matches!(sup.start_turn(&as_tree("t"), bad).await, Err(Error::InvalidInput { .. })));
        // `interrupt`: queued behind `one`, and the running turn is cancelled.
        let two = queued(sup.start_turn(&as_tree("t"), ask("two", Multitask::Interrupt)).await.unwrap());
        assert_eq!((two.turn.run_id().to_string().as_str(), two.turn.position), ("t/0~2", 2));
        assert!(matches!(
            sup.start_turn(&as_tree("t"), ask("three", Multitask::Enqueue)).await,
            Err(Error::TurnQueueFull { limit: 2, .. })
        ));
        let first = kept.await.unwrap().unwrap();
        assert_eq!(first.state.status, AgentStatus::Cancelled);
        sup.until_ended(&as_tree("t")).await;
        let waiting: Vec<String> =
            store.queued_turns(&as_tree("t")).unwrap().iter().map(|q| q.run_id().to_string()).collect();
        assert_eq!(waiting, ["t/0~1", "t/0~2"]);
        // Only the next turn is taken, and only once its tree has ended.
        assert!(sup.next_turn(&as_tree("t"), Some(two.turn.id)).await.unwrap().is_none());
        let (turn, handle) = sup.next_turn(&as_tree("t"), None).await.unwrap().unwrap();
        assert_eq!(turn.id, one.turn.id);
        assert!(sup.next_turn(&as_tree("t"), None).await.unwrap().is_none(), "one turn at a time");
        let ran = finish(handle).await;
        assert_eq!(ran.state.run_id, "t/0~1");
        assert_eq!(texts(&ran.state), ["slow", "one", "answer"]);
        sup.until_ended(&as_tree("t")).await;
        let (_, handle) = sup.next_turn(&as_tree("t"), None).await.unwrap().unwrap();
        let ran = finish(handle).await;
        assert_eq!(ran.state.run_id, "t/0~2");
        assert_eq!(texts(&ran.state).last().unwrap(), "answer");
        sup.until_ended(&as_tree("t")).await;
        assert!(sup.next_turn(&as_tree("t"), None).await.unwrap().is_none());
        assert!(store.queued_turns(&as_tree("t")).unwrap().is_empty());
        // The journal shows both queued, as events of the runs they became.
        sup.flush().await.unwrap();
        let queued: Vec<(String, u64)> = store
            .events(&as_tree("t"), 0)
            .unwrap()
            .into_iter()
            .filter(|e| e.kind.name() == "turnQueued")
            .map(|e| (e.run_id.to_string(), e.get("position").and_then(|p| p.as_u64()).unwrap()))
            .collect();
        assert_eq!(queued, [("t/0~1".to_owned(), 1), ("t/0~2".to_owned(), 2)]);
        // An ended tree with none waiting starts a turn at once.
        assert!(matches!(
            sup.start_turn(&as_tree("t"), TurnRequest::new("four")).await.unwrap(),
            TurnStart::Started(h) if h.root_run_id == "t/0~3"
        ));
    }
}

/// Issue 34: a template's instructions live for the turn they were given in.
/// A turn that failed before it could end (here at its step limit) still
/// hands the next turn a history without them, so a conversation of many
/// turns carries one copy, the current turn's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_turns_instructions_do_not_pile_up_in_the_next_turn() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.db")).unwrap());
    let model = scripted(json!({"replies": [
        {"agent": "chat", "prompt": "second", "steps": [{"text": "second answer"}]},
        {"agent": "chat", "steps": [
            {"toolCalls": [call("echo", json!({"n": 1}))]},
            {"text": "never reached"}
        ]}
    ]}));
    let mut chat = template("chat").max_steps(1);
    chat.instructions_prompt = Some(Arc::from("the rules"));
    let catalog = Catalog::builder()
        .model(model as Arc<dyn Model>)
        .tool(echo() as Arc<dyn Tool>)
        .template(chat)
        .build()
        .unwrap();
    let sup = Supervisor::new(catalog, TreeLimits::default())
        .with_store(store)
        .unwrap();
    let first = finish(start(&sup, "chat", "first question").await).await;
    assert_eq!(first.state.status, AgentStatus::Failed, "at its step limit");
    assert!(texts(&first.state).contains(&"the rules".to_owned()));
    let second = finish(turn(&sup, "t", "second question").await.unwrap()).await;
    let history = texts(&second.state);
    let copies = |h: &[String]| h.iter().filter(|t| *t == "the rules").count();
    assert_eq!(
        copies(&history),
        0,
        "expired when the turn ended: {history:?}"
    );
    assert!(
        history.contains(&"first question".to_owned())
            && history.contains(&"second answer".to_owned()),
        "{history:?}"
    );
}

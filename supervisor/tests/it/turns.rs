//! Follow-up turns (semantics §14): an ended tree gets a new prompt; its
//! root goes on from its final state as run `T/0~n` of the same agent.

use std::sync::Arc;

use arbor_actors::{AgentStatus, Model, Tool};
use arbor_supervisor::store::{SqliteStore, Store};
use arbor_supervisor::{Catalog, Error, Supervisor, TreeLimits, TreeStatus};
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

    let handle = sup
        .start_turn("t", "second question".into(), None)
        .await
        .unwrap();
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
    let third = finish(
        sup.start_turn("t", "third question".into(), None)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(third.state.run_id, "t/0~2");
    assert_eq!(third.state.child_run_ids, ["t/0~2.1"]);
    assert_eq!(texts(&third.state).last().unwrap(), "third answer");
    sup.flush().await.unwrap();
    let (record, summary) = store.tree("t").unwrap();
    assert_eq!(summary.status, TreeStatus::Completed);
    assert_eq!(record.root_run_id, "t/0~2");
    // Every turn's root is on record.
    let roots: Vec<String> = store
        .runs("t")
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
        sup.start_turn("nope", "hi".into(), None).await,
        Err(Error::UnknownTree(t)) if t == "nope"
    ));
    let handle = start(&sup, "chat", "first question").await;
    // Still running (or just ended): a turn of a running tree is refused.
    if sup.is_running("t") {
        assert!(matches!(
            sup.start_turn("t", "again".into(), None).await,
            Err(Error::TreeExists(_)) | Err(Error::NotResumable { .. })
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
        storeless.start_turn("t", "hi".into(), None).await,
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
    assert!(sup.cancel_tree("t"));
    sup.until_ended("t").await;
    let cancelled = kept.await.unwrap().unwrap();
    assert_eq!(cancelled.state.status, AgentStatus::Cancelled);
    assert!(!sup.is_running("t"));
    let next = finish(sup.start_turn("t", "go on".into(), None).await.unwrap()).await;
    assert_eq!(texts(&next.state), ["slow", "go on", "answer"]);
}

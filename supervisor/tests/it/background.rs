//! Background children across a live tree (semantics §15): the call answers
//! at once, each report joins the parent's history at a step boundary, and a
//! turn that would end waits for the rest (or cancels them).

use arbor_actors::background::{BACKGROUND_REPORT, reported_agent};
use arbor_actors::{AgentState, AgentStatus, EventKind, OnTurnEnd};
use arbor_supervisor::TreeLimits;
use serde_json::{Value, json};

use crate::common::*;

fn async_call(children: &[(&str, &str)]) -> Value {
    let agents: Vec<Value> = children
        .iter()
        .map(|(t, p)| json!({"agent_type": t, "prompt": p}))
        .collect();
    call("spawn_agents_async", json!({"agents": agents}))
}

fn lead() -> arbor_actors::AgentTemplate {
    let mut t = template("lead").spawns(&["worker"]);
    t.tools.push("spawn_agents_async".into());
    t
}

/// The agent ids of the report messages of `state`, in history order.
fn reports(state: &AgentState) -> Vec<String> {
    state
        .message_history
        .iter()
        .filter(|m| m.has_tag(BACKGROUND_REPORT))
        .filter_map(|m| reported_agent(m).map(|a| a.to_string()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn background_children_answer_at_once_and_each_report_starts_a_step_of_the_waiting_parent() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [async_call(&[("worker", "slow"), ("worker", "fast")])]},
            {"text": "started them"},
            {"text": "got the fast one"},
            {"text": "got both"}
        ]},
        {"agent": "worker", "prompt": "slow", "steps": [{"text": "S", "delayMs": 500}]},
        {"agent": "worker", "prompt": "fast", "steps": [{"text": "F", "delayMs": 100}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![lead(), template("worker")],
        TreeLimits::default(),
    );
    let (result, events) = run(&sup, "lead", "go").await;
    let root = &result.state;
    assert_eq!(root.status, AgentStatus::Completed, "{root:#?}");

    // The call's result lists both children as running, in request order.
    let entries = tool_result(root, "spawn_agents_async");
    let entries = entries.as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().all(|e| e["status"] == "running"));
    let slow = rid(entries[0]["runId"].as_str().unwrap());
    let fast = rid(entries[1]["runId"].as_str().unwrap());

    // Each report once, in the order they came: the fast one first.
    assert_eq!(reports(root), [fast.to_string(), slow.to_string()]);
    assert_eq!(root.child_run_ids, [fast.clone(), slow.clone()]);
    // Four steps: the spawn, the turn that would end, one per report.
    let texts: Vec<String> = root
        .message_history
        .iter()
        .filter(|m| m.is_assistant())
        .map(|m| m.text())
        .filter(|t| !t.is_empty())
        .collect();
    assert_eq!(texts, ["started them", "got the fast one", "got both"]);
    // The fast report is answered by the step after it, before the slow one came.
    let at = |pred: &dyn Fn(&arbor_actors::Message) -> bool| {
        root.message_history.iter().position(|m| pred(m)).unwrap()
    };
    let fast_at = at(&|m| reported_agent(m).is_some_and(|a| a == fast));
    let answered_at = at(&|m| m.text() == "got the fast one");
    let slow_at = at(&|m| reported_agent(m).is_some_and(|a| a == slow));
    assert!(fast_at < answered_at && answered_at < slow_at);

    let delivered: Vec<(u32, RunId)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::BackgroundDelivered { step, child_run_id } => {
                Some((*step, child_run_id.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(delivered, [(2, fast.clone()), (3, slow.clone())]);
    // The waiting parent gave its live slot back.
    assert!(
        events
            .iter()
            .any(|e| matches!(e.kind, EventKind::Suspended) && e.run_id == root.run_id)
    );
    for run in [&fast, &slow] {
        let child = sup.finished_state(run).expect("child kept");
        assert_eq!(child.status, AgentStatus::Completed);
    }
}

#[tokio::test(start_paused = true)]
async fn a_report_that_comes_during_the_last_step_is_answered_before_the_turn_ends() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [async_call(&[("worker", "quick")])]},
            {"text": "thinking slowly", "delayMs": 200},
            {"text": "read the report"}
        ]},
        {"agent": "worker", "steps": [{"text": "Q", "delayMs": 10}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![lead(), template("worker")],
        TreeLimits::default(),
    );
    let (result, _) = run(&sup, "lead", "go").await;
    let root = &result.state;
    assert_eq!(root.status, AgentStatus::Completed);
    assert_eq!(reports(root).len(), 1);
    let last = root.message_history.iter().last().unwrap();
    assert_eq!(last.text(), "read the report");
}

#[tokio::test(start_paused = true)]
async fn on_turn_end_cancel_ends_the_turn_and_cancels_the_children_still_running() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [async_call(&[("worker", "forever")])]},
            {"text": "not waiting", "delayMs": 50}
        ]},
        {"agent": "worker", "steps": [{"text": "late", "delayMs": 60000}]}
    ]}));
    let mut lead = lead();
    lead.on_turn_end = OnTurnEnd::Cancel;
    let sup = supervisor(
        &model,
        vec![lead, template("worker")],
        TreeLimits::default(),
    );
    let started = tokio::time::Instant::now();
    let (result, _) = run(&sup, "lead", "go").await;
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    let root = &result.state;
    assert_eq!(root.status, AgentStatus::Completed);
    assert!(reports(root).is_empty());
    assert_eq!(root.child_run_ids.len(), 1, "{root:#?}");
    let child = sup.finished_state(&root.child_run_ids[0]).expect("kept");
    assert_eq!(child.status, AgentStatus::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn a_refused_background_child_is_named_in_the_result_and_never_awaited() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [async_call(&[("nobody", "x"), ("worker", "y")])]},
            {"text": "waiting"},
            {"text": "done"}
        ]},
        {"agent": "worker", "steps": [{"text": "Y", "delayMs": 10}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![lead(), template("worker")],
        TreeLimits::default(),
    );
    let (result, _) = run(&sup, "lead", "go").await;
    let root = &result.state;
    assert_eq!(root.status, AgentStatus::Completed);
    let entries = tool_result(root, "spawn_agents_async");
    assert_eq!(entries[0]["agentType"], "nobody");
    assert!(
        entries[0]["errorMessage"]
            .as_str()
            .unwrap()
            .contains("not found")
    );
    assert_eq!(entries[1]["status"], "running");
    assert_eq!(reports(root).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_parent_with_no_steps_left_takes_the_reports_without_a_step_and_completes() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [async_call(&[("worker", "a"), ("worker", "b")])]},
            {"text": "that was my last step"}
        ]},
        {"agent": "worker", "steps": [{"text": "W", "delayMs": 50}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![lead().max_steps(2), template("worker")],
        TreeLimits::default(),
    );
    let (result, _) = run(&sup, "lead", "go").await;
    let root = &result.state;
    assert_eq!(root.status, AgentStatus::Completed, "{root:#?}");
    assert_eq!(reports(root).len(), 2);
    assert_eq!(root.child_run_ids.len(), 2);
}

fn durable_lead(
    store: Option<std::sync::Arc<arbor_supervisor::store::SqliteStore>>,
) -> arbor_supervisor::Supervisor {
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [async_call(&[("worker", "slow"), ("worker", "fast")])]},
            {"text": "started them"},
            {"text": "got the fast one"},
            {"text": "got both"}
        ]},
        {"agent": "worker", "prompt": "slow", "steps": [{"text": "S", "delayMs": 150}]},
        {"agent": "worker", "prompt": "fast", "steps": [{"text": "F", "delayMs": 10}]}
    ]});
    let catalog = arbor_supervisor::Catalog::builder()
        .model(scripted(script))
        .template(lead())
        .template(template("worker"))
        .build()
        .unwrap();
    let sup = arbor_supervisor::Supervisor::new(catalog, TreeLimits::default());
    match store {
        Some(store) => sup.with_store(store).unwrap(),
        None => sup,
    }
}

/// A durable tree with background children, cut after every record from its
/// spawn on (as if the process died there) and resumed: it ends exactly as it
/// did, each report delivered once and where it was. And replayed on its
/// recorded replies and deliveries, it matches.
#[test]
fn a_tree_with_background_children_resumed_from_every_cut_and_replayed_ends_as_it_did() {
    use arbor_supervisor::store::{SqliteStore, Store};
    use std::sync::Arc;
    let rt = crate::store::runtime();
    let dir = tempfile::tempdir().unwrap();
    let whole_path = dir.path().join("whole.db");
    let whole = rt.block_on(async {
        let sup = durable_lead(Some(Arc::new(SqliteStore::open(&whole_path).unwrap())));
        let state = finish(start(&sup, "lead", "go").await).await.state;
        sup.flush().await.unwrap();
        (*state).clone()
    });
    assert_eq!(whole.status, AgentStatus::Completed);
    assert_eq!(reports(&whole).len(), 2);
    let records = crate::store::records(&rusqlite::Connection::open(&whole_path).unwrap());
    let spawned_at = records
        .iter()
        .position(|r| r["type"] == "childSpawned")
        .expect("the spawn is journaled");
    let mut checked = 0;
    for keep in spawned_at..records.len() {
        if records[keep - 1].get("seq").is_none() {
            continue;
        }
        let path = dir.path().join(format!("cut{keep}.db"));
        crate::store::cut(&whole_path, &path, &records, keep);
        let state = rt.block_on(async {
            let sup = durable_lead(Some(Arc::new(SqliteStore::open(&path).unwrap())));
            (*finish(sup.resume(&as_tree("t")).await.unwrap()).await.state).clone()
        });
        assert_eq!(
            state,
            whole,
            "resumed after record {keep} ({})",
            records[keep - 1]["type"]
        );
        checked += 1;
    }
    assert!(checked >= 5, "{checked} cuts");

    // Replay: recorded replies and deliveries only, no store.
    rt.block_on(async {
        let store = SqliteStore::open(&whole_path).unwrap();
        let recovery = store.recovery(&as_tree("t")).unwrap();
        let (record, _) = store.tree(&as_tree("t")).unwrap();
        let sup = durable_lead(None);
        let handle = sup
            .replay(record.request().unwrap(), recovery)
            .await
            .unwrap();
        let replayed = finish(handle).await.state;
        assert_eq!(*replayed, whole);
    });
}

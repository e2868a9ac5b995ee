//! Cancellation (semantics §8): cancelling an agent cancels its whole subtree,
//! the rest of the tree goes on, and no actor is left behind. Status is served
//! while a step is in flight.

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::time::Duration;

use arbor_actors::{AgentStatus, Event, EventKind};
use arbor_supervisor::{Error, StartRequest, TreeLimits};
use serde_json::json;

use crate::common::*;

fn started_type(e: &Event, t: &str) -> bool {
    matches!(&e.kind, EventKind::AgentStarted { agent_type, .. } if agent_type == t)
}

/// lead → [mid → [leaf, leaf], sib]; leaves take a minute, the sibling two seconds.
fn branching_tree() -> arbor_supervisor::Supervisor {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("mid", "branch"), ("sib", "sibling")])]},
            {"text": "lead done"}
        ]},
        {"agent": "mid", "steps": [
            {"text": "fanning out", "toolCalls": [spawn_call(&[("leaf", "l1"), ("leaf", "l2")])]},
            {"text": "mid done"}
        ]},
        {"agent": "leaf", "steps": [{"text": "leaf done", "delayMs": 60000}]},
        {"agent": "sib", "steps": [{"text": "sibling done", "delayMs": 2000}]}
    ]}));
    supervisor(
        &model,
        vec![
            template("lead").spawns(&["mid", "sib"]),
            template("mid").spawns(&["leaf"]),
            template("leaf"),
            template("sib"),
        ],
        TreeLimits::default(),
    )
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_mid_tree_agent_cancels_its_subtree_only() {
    let sup = branching_tree();
    let mut rx = sup.subscribe();
    let started = tokio::time::Instant::now();
    let handle = start(&sup, "lead", "go").await;
    let mut seen = Vec::new();
    let mid_run = wait_for(&mut rx, &mut seen, |e| started_type(e, "mid"))
        .await
        .run_id
        .clone();
    // Both leaves are running (their model calls pending) before the cancel.
    wait_for(&mut rx, &mut seen, |e| started_type(e, "leaf")).await;
    wait_for(&mut rx, &mut seen, |e| started_type(e, "leaf")).await;
    assert_eq!(sup.live_actors(), 5, "lead, mid, sib and two leaves");
    assert_eq!(
        sup.state(&mid_run).await.unwrap().status,
        AgentStatus::Running
    );

    sup.cancel_run(&mid_run).unwrap();
    let result = finish(handle).await;
    seen.extend(drain(&mut rx));
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(60),
        "ends with the sibling, not the leaves: {elapsed:?}"
    );
    assert_eq!(sup.live_actors(), 0);

    // The parent completes; the cancelled child is an error entry, the sibling fine.
    assert_eq!(result.state.status, AgentStatus::Completed);
    assert_eq!(last_text(&result.value), "lead done");
    let entries = tool_result(&result.state, "spawn_agents");
    let error = error_of(&entries[0]).expect("mid is an error entry");
    assert!(error.to_lowercase().contains("cancel"), "{error}");
    assert_eq!(entries[0]["runId"], mid_run.to_string());
    assert_eq!(last_text(&entries[1]["value"]), "sibling done");

    // The whole subtree ended cancelled, and kept its history.
    let states = final_states(&seen);
    assert_eq!(states.len(), 5);
    let mid = &states[&mid_run];
    assert_eq!(mid.status, AgentStatus::Cancelled);
    let mid_texts: Vec<String> = mid.message_history.iter().map(|m| m.text()).collect();
    assert_eq!(mid_texts, ["branch", "fanning out"]);
    assert_eq!(mid.child_run_ids.len(), 2, "its children stay on record");
    for leaf in &mid.child_run_ids {
        let leaf = sup.finished_state(leaf).expect("leaf kept");
        assert_eq!(leaf.status, AgentStatus::Cancelled);
        assert_eq!(leaf.message_history.len(), 1);
    }
    let sib = &states[&result.state.child_run_ids[1]];
    assert_eq!(sib.agent_type.as_deref(), Some("sib"));
    assert_eq!(sib.status, AgentStatus::Completed);
    let cancelled: HashSet<&RunId> = seen
        .iter()
        .filter(|e| matches!(e.kind, EventKind::AgentCancelled { .. }))
        .map(|e| &e.run_id)
        .collect();
    assert_eq!(cancelled.len(), 3);
    assert!(cancelled.contains(&mid_run));

    // A finished run can no longer be cancelled.
    assert!(matches!(
        sup.cancel_run(&mid_run),
        Err(Error::UnknownRun(_))
    ));
}

/// A child that ended while its parent still runs is no waiting child, nor
/// is a run id its parent never spawned: a cancel or a steer by either is
/// refused as unknown, also where the supervisor keeps no finished states
/// (`arbor serve` keeps none). Between 2c1af38 and the fix, "waiting" was
/// read from the run id's shape alone, and both answered as if waiting.
#[tokio::test(start_paused = true)]
async fn an_ended_or_never_spawned_child_of_a_running_parent_is_unknown_to_cancel_and_steer() {
    use std::sync::Arc;

    use arbor_actors::Model;
    use arbor_supervisor::{Retain, Supervisor};

    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("mid", "branch"), ("sib", "sibling")])]},
            {"text": "lead done"}
        ]},
        {"agent": "mid", "steps": [{"text": "mid done", "delayMs": 60000}]},
        {"agent": "sib", "steps": [{"text": "sibling done", "delayMs": 2000}]}
    ]}));
    let models: Vec<(&str, Arc<dyn Model>)> = vec![(model.name(), model.clone())];
    let templates = vec![
        template("lead").spawns(&["mid", "sib"]),
        template("mid"),
        template("sib"),
    ];
    let sup = Supervisor::with_retention(
        catalog(models, templates, Vec::new()),
        TreeLimits::default(),
        Retain::None,
    );
    let mut rx = sup.subscribe();
    let handle = start(&sup, "lead", "go").await;
    let mut seen = Vec::new();
    let sib_run = wait_for(&mut rx, &mut seen, |e| {
        matches!(&e.kind, EventKind::AgentFinished { state, .. }
            if state.agent_type.as_deref() == Some("sib"))
    })
    .await
    .run_id
    .clone();
    assert_eq!(sup.live_actors(), 2, "lead waits for mid");
    let never = handle.root_run_id.child(99);
    for run in [&sib_run, &never] {
        assert!(
            matches!(sup.cancel_run(run), Err(Error::UnknownRun(_))),
            "cancel {run}: {:?}",
            sup.cancel_run(run)
        );
        assert!(
            matches!(sup.steer(run, "hello").await, Err(Error::UnknownRun(_))),
            "steer {run}"
        );
    }
    handle.cancel();
    finish(handle).await;
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_tree_cancels_every_agent() {
    let sup = branching_tree();
    let mut rx = sup.subscribe();
    let handle = start(&sup, "lead", "go").await;
    let root_run = handle.root_run_id.clone();
    let mut seen = Vec::new();
    wait_for(&mut rx, &mut seen, |e| started_type(e, "leaf")).await;
    wait_for(&mut rx, &mut seen, |e| started_type(e, "leaf")).await;
    assert_eq!(handle.live_actors(), 5);

    handle.cancel();
    let started = tokio::time::Instant::now();
    let result = finish(handle).await;
    assert!(started.elapsed() < Duration::from_secs(1));
    seen.extend(drain(&mut rx));
    assert_eq!(sup.live_actors(), 0);

    assert_eq!(result.state.status, AgentStatus::Cancelled);
    assert_eq!(result.state.run_id, root_run);
    assert_eq!(
        result.value,
        json!({"type": "error", "message": "Agent was cancelled"})
    );
    // The root keeps the history it had, and every child on record.
    assert_eq!(result.state.message_history.len(), 2);
    assert_eq!(result.state.child_run_ids.len(), 2);
    let states = final_states(&seen);
    assert_eq!(states.len(), 5);
    for state in states.values() {
        assert_eq!(
            state.status,
            AgentStatus::Cancelled,
            "{:?}",
            state.agent_type
        );
        assert_eq!(
            sup.finished_state(&state.run_id).unwrap().status,
            AgentStatus::Cancelled
        );
    }
    let answered: Vec<&str> = seen
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ModelResponded { .. }))
        .filter_map(|e| states[&e.run_id].agent_type.as_deref())
        .collect();
    assert_eq!(
        answered,
        ["lead", "mid"],
        "no leaf or sibling call completed"
    );
}

#[tokio::test(start_paused = true)]
async fn status_is_served_while_a_model_call_is_pending() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"text": "spawning", "toolCalls": [spawn_call(&[("w", "work")])], "delayMs": 10000},
            {"text": "lead done"}
        ]},
        {"agent": "w", "steps": [{"text": "worked", "delayMs": 5000}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![template("lead").spawns(&["w"]), template("w")],
        TreeLimits::default(),
    );
    let mut rx = sup.subscribe();
    let started = tokio::time::Instant::now();
    let handle = start(&sup, "lead", "go").await;
    let root = handle.root_run_id.clone();
    let mut seen = Vec::new();
    wait_for(&mut rx, &mut seen, |e| {
        matches!(e.kind, EventKind::StepStarted { step: 1 }) && e.run_id == root
    })
    .await;

    // The model call is in flight: the actor still answers.
    let state = tokio::time::timeout(Duration::from_secs(1), sup.state(&root))
        .await
        .expect("status answered without waiting for the model")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(state.status, AgentStatus::Running);
    assert_eq!(state.steps_remaining, 19);
    assert_eq!(state.message_history.len(), 1);
    assert_eq!(model.requests().len(), 1);
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e.kind, EventKind::ModelResponded { .. }))
    );

    // While its child's call is pending, both answer.
    let child = wait_for(&mut rx, &mut seen, |e| {
        matches!(e.kind, EventKind::StepStarted { step: 1 }) && e.run_id != root
    })
    .await
    .run_id
    .clone();
    let child_state = sup.state(&child).await.unwrap();
    assert_eq!(child_state.status, AgentStatus::Running);
    assert_eq!(&*child_state.ancestor_run_ids, std::slice::from_ref(&root));
    let parent_state = sup.state(&root).await.unwrap();
    assert_eq!(parent_state.status, AgentStatus::Running);
    assert_eq!(
        parent_state.message_history.len(),
        2,
        "its reply is recorded"
    );
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(10) && elapsed < Duration::from_secs(15),
        "{elapsed:?}"
    );

    let result = finish(handle).await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    // Afterwards the same query is answered from the registry.
    assert_eq!(sup.state(&root).await.unwrap(), *result.state);
    assert_eq!(
        sup.state(&child).await.unwrap().status,
        AgentStatus::Completed
    );
    assert!(matches!(
        sup.state(&rid("t9/0")).await,
        Err(Error::UnknownRun(_))
    ));
}

/// On worker threads, with a cancel racing the tree at every stage: whatever
/// happens, `wait` returns only when no actor of the tree is left, and every run
/// that started has a final state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_actor_outlives_wait_on_a_multi_thread_runtime() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("mid", "a"), ("mid", "b"), ("mid", "c")])]},
            {"text": "done"}
        ]},
        {"agent": "mid", "steps": [
            {"toolCalls": [spawn_call(&[("leaf", "x"), ("leaf", "y")])]},
            {"text": "done"}
        ]},
        {"agent": "leaf", "steps": [{"text": "leaf"}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![
            template("lead").spawns(&["mid"]),
            template("mid").spawns(&["leaf"]),
            template("leaf"),
        ],
        TreeLimits::default(),
    );
    let mut outcomes = HashSet::new();
    for i in 0..300 {
        let tree = format!("mt{i}");
        let mut rx = sup.events().subscribe_tree(&as_tree(&tree));
        let handle = sup
            .start(StartRequest {
                tree_id: Some(tree.parse().unwrap()),
                ..request("lead", "go")
            })
            .await
            .unwrap();
        // Cancel after a varying number of events (or never).
        let cancel_after = i % 12;
        let mut n = 0;
        while n < cancel_after {
            match rx.recv().await {
                Some(e) => {
                    n += 1;
                    if e.kind.final_state().is_some() && e.run_id == handle.root_run_id {
                        break;
                    }
                }
                None => break,
            }
        }
        if i % 12 != 11 {
            handle.cancel();
        }
        let result = tokio::time::timeout(Duration::from_secs(30), handle.wait())
            .await
            .expect("the tree ends")
            .unwrap();
        assert_eq!(sup.live_actors(), 0, "tree {i}");
        assert!(result.state.status.is_final());
        outcomes.insert(result.state.status);
        let events = drain(&mut rx);
        let started: HashSet<RunId> = events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::AgentStarted { .. }))
            .map(|e| e.run_id.clone())
            .collect();
        for run in &started {
            assert!(
                sup.finished_state(run).is_some(),
                "tree {i}: {run} unfinished"
            );
        }
    }
    assert!(outcomes.contains(&AgentStatus::Completed));
    assert!(outcomes.contains(&AgentStatus::Cancelled));
}

#[tokio::test(start_paused = true)]
async fn a_child_cancelled_while_it_waits_for_a_live_slot_ends_cancelled_without_starting() {
    // One live slot: the first worker runs (a minute), the second waits for it.
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("worker", "first"), ("worker", "second")])]},
            {"text": "lead done"}
        ]},
        {"agent": "worker", "steps": [{"text": "worked", "delayMs": 60000}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![template("lead").spawns(&["worker"]), template("worker")],
        TreeLimits {
            max_live_agents: NonZeroUsize::new(1),
            ..TreeLimits::default()
        },
    );
    let mut rx = sup.subscribe();
    let handle = start(&sup, "lead", "go").await;
    let mut seen = Vec::new();
    // Both are spawned; the first starts, the second waits for its slot.
    let mut spawned = Vec::new();
    while spawned.len() < 2 {
        let e = wait_for(&mut rx, &mut seen, |e| {
            matches!(e.kind, EventKind::ChildSpawned { .. })
        })
        .await;
        if let EventKind::ChildSpawned { child_run_id, .. } = &e.kind {
            spawned.push(child_run_id.clone());
        }
    }
    wait_for(&mut rx, &mut seen, |e| started_type(e, "worker")).await;
    let waiting = spawned[1].clone();

    sup.cancel_run(&waiting)
        .expect("the waiting child is cancelled, not unknown");
    let result = finish(handle).await;
    seen.extend(drain(&mut rx));

    // It never started, and its entry says it was cancelled; the first ran.
    assert!(
        !seen
            .iter()
            .any(|e| e.run_id == waiting && matches!(e.kind, EventKind::AgentStarted { .. })),
        "the cancelled child started"
    );
    assert_eq!(result.state.status, AgentStatus::Completed);
    let entries = tool_result(&result.state, "spawn_agents");
    assert_eq!(error_of(&entries[1]), Some("Agent was cancelled"));
    assert_eq!(last_text(&entries[0]["value"]), "worked");
    assert!(seen.iter().any(|e| matches!(
        &e.kind,
        EventKind::ChildFinished { child_run_id, status: AgentStatus::Cancelled } if *child_run_id == waiting
    )));
    assert_eq!(sup.live_actors(), 0);
    // An id nothing knows is still unknown.
    assert!(matches!(
        sup.cancel_run(&rid("nope/0.9")),
        Err(Error::UnknownRun(_))
    ));
}

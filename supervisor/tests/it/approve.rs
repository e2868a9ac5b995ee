//! Approvals (semantics §12): a call that needs a person's decision parks
//! its agent, wherever it is in the tree, while the rest of the tree goes on;
//! the decision is journaled, survives a restart and replays.

use std::num::NonZeroUsize;
use std::sync::Arc;

use arbor_actors::approval::{DecideRefused, Decision};
use arbor_actors::{AgentStatus, Event, EventKind, Model, Tool};
use arbor_supervisor::store::{SqliteStore, Store};
use arbor_supervisor::{Catalog, Error, Supervisor, TreeLimits};
use serde_json::{Value, json};

use crate::common::*;

/// lead → [mid → [sub → [leaf]], sib]: the leaf (depth 3) calls `echo`,
/// which needs approval; the sibling only answers.
fn script() -> Value {
    json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("mid", "branch"), ("sib", "sibling")])]},
            {"text": "lead done"}
        ]},
        {"agent": "mid", "steps": [
            {"toolCalls": [spawn_call(&[("sub", "deeper")])]},
            {"text": "mid done"}
        ]},
        {"agent": "sub", "steps": [
            {"toolCalls": [spawn_call(&[("leaf", "deepest")])]},
            {"text": "sub done"}
        ]},
        {"agent": "leaf", "steps": [
            {"text": "Writing.", "toolCalls": [{"name": "echo", "input": {"n": 1}}]},
            {"text": "leaf done"}
        ]},
        {"agent": "sib", "steps": [{"text": "sibling done"}]}
    ]})
}

/// One live slot: a parked agent that kept its slot would starve the sibling.
fn tree(store: Option<Arc<SqliteStore>>) -> Supervisor {
    let mut leaf = with_echo(template("leaf"));
    leaf.approve = vec!["echo".into()];
    let catalog = Catalog::builder()
        .model(scripted(script()) as Arc<dyn Model>)
        .tool(echo() as Arc<dyn Tool>)
        .template(template("lead").spawns(&["mid", "sib"]))
        .template(template("mid").spawns(&["sub"]))
        .template(template("sub").spawns(&["leaf"]))
        .template(leaf)
        .template(template("sib"))
        .build()
        .unwrap();
    let limits = TreeLimits {
        max_live_agents: NonZeroUsize::new(1),
        ..TreeLimits::default()
    };
    let sup = Supervisor::new(catalog, limits);
    match store {
        Some(store) => sup.with_store(store).unwrap(),
        None => sup,
    }
}

fn ended(e: &Event, agent: &str) -> bool {
    matches!(&e.kind, EventKind::AgentFinished { state, .. }
        if state.agent_type.as_deref() == Some(agent))
}

fn asked(e: &Event) -> bool {
    matches!(e.kind, EventKind::ApprovalRequested { .. })
}

/// The leaf's echo result in the final tree: what the tool ran with.
fn leaf_echo(sup: &Supervisor) -> Value {
    let leaf = sup
        .approvals(None)
        .first()
        .map(|p| p.run_id.clone())
        .unwrap_or_else(|| rid("t/0.1.1.1"));
    let state = sup.finished_state(&leaf).expect("the leaf finished");
    tool_result(&state, "echo")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_at_depth_three_parks_only_its_agent_and_an_edited_input_runs() {
    let sup = tree(None);
    let mut rx = sup.subscribe();
    let mut seen = Vec::new();
    let handle = start(&sup, "lead", "go").await;
    let request = wait_for(&mut rx, &mut seen, asked).await;
    assert_eq!(request.run_id, "t/0.1.1.1", "the leaf, at depth 3");
    // The sibling gets the one live slot and finishes while the leaf waits.
    if !seen.iter().any(|e| ended(e, "sib")) {
        wait_for(&mut rx, &mut seen, |e| ended(e, "sib")).await;
    }
    let pending = sup.approvals(Some(&as_tree("t")));
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(
        (
            pending[0].tool.as_str(),
            pending[0].input.clone(),
            pending[0].step
        ),
        ("echo", json!({"n": 1}), 1)
    );
    let call = pending[0].tool_call_id.clone();
    // A decision for a call that does not wait is refused, naming it.
    assert!(matches!(
        sup.decide(&as_tree("t"), "nope", Decision::Approve { input: None }).await,
        Err(Error::UnknownApproval { call_id, .. }) if call_id == "nope"
    ));
    let bad = sup
        .decide(
            &as_tree("t"),
            &call,
            Decision::Approve {
                input: Some(json!("not an object")),
            },
        )
        .await;
    assert!(
        matches!(
            bad,
            Err(Error::DecisionRefused {
                reason: DecideRefused::InvalidInput(_),
                ..
            })
        ),
        "{bad:?}"
    );
    sup.decide(
        &as_tree("t"),
        &call,
        Decision::Approve {
            input: Some(json!({"n": 7})),
        },
    )
    .await
    .unwrap();
    let result = finish(handle).await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    assert!(sup.approvals(None).is_empty());
    let echo = tool_result(&sup.finished_state(&rid("t/0.1.1.1")).unwrap(), "echo");
    assert_eq!(
        echo,
        json!({"echo": {"n": 7}}),
        "it ran with the edited input"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_gives_the_model_the_reason() {
    let sup = tree(None);
    let mut rx = sup.subscribe();
    let mut seen = Vec::new();
    let handle = start(&sup, "lead", "go").await;
    wait_for(&mut rx, &mut seen, asked).await;
    let call = sup.approvals(Some(&as_tree("t")))[0].tool_call_id.clone();
    sup.decide(
        &as_tree("t"),
        &call,
        Decision::Deny {
            reason: "not today".into(),
        },
    )
    .await
    .unwrap();
    finish(handle).await;
    let leaf = sup.finished_state(&rid("t/0.1.1.1")).unwrap();
    let denied = leaf
        .message_history
        .iter()
        .find(|m| is_tool_error(m))
        .expect("an error result")
        .text();
    assert!(
        denied.contains("The user denied this tool call: not today"),
        "{denied}"
    );
}

/// A pending approval survives its process: the tree is handed over while the
/// leaf waits, resumed by another supervisor on the same store, where the
/// approval is pending again; deciding it there completes the tree, and a
/// replay of the stored tree (replies, decisions) matches every final state.
#[test]
fn a_pending_approval_survives_a_restart_and_the_tree_replays() {
    let rt = crate::store::runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    rt.block_on(async {
        let sup = tree(Some(Arc::new(SqliteStore::open(&path).unwrap())));
        let mut rx = sup.subscribe();
        let mut seen = Vec::new();
        let handle = start(&sup, "lead", "go").await;
        wait_for(&mut rx, &mut seen, asked).await;
        sup.flush().await.unwrap();
        assert_eq!(sup.release().await.unwrap(), vec![as_tree("t")]);
        handle.cancel();
        let _ = tokio::time::timeout(GUARD, handle.wait()).await;
    });
    let finals = rt.block_on(async {
        let store = Arc::new(SqliteStore::open(&path).unwrap());
        let sup = tree(Some(store.clone()));
        let mut rx = sup.events().subscribe_tree(&as_tree("t"));
        let mut seen = Vec::new();
        let handle = sup.resume(&as_tree("t")).await.unwrap();
        if sup.approvals(Some(&as_tree("t"))).is_empty() {
            wait_for(&mut rx, &mut seen, asked).await;
        }
        let pending = sup.approvals(Some(&as_tree("t")));
        assert_eq!(
            pending.len(),
            1,
            "pending again after the restart: {pending:?}"
        );
        sup.decide(
            &as_tree("t"),
            &pending[0].tool_call_id,
            Decision::Approve { input: None },
        )
        .await
        .unwrap();
        let result = finish(handle).await;
        assert_eq!(result.state.status, AgentStatus::Completed);
        sup.flush().await.unwrap();
        store.final_states(&as_tree("t")).unwrap()
    });
    rt.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        let (record, _) = store.tree(&as_tree("t")).unwrap();
        let sup = tree(None);
        let handle = sup
            .replay(
                record.request().unwrap(),
                store.recovery(&as_tree("t")).unwrap(),
            )
            .await
            .unwrap();
        finish(handle).await;
        assert!(sup.approvals(None).is_empty(), "a replay asks no one");
        for want in &finals {
            let got = sup.finished_state(&want.run_id).expect("replayed");
            assert_eq!(*got, *want, "run {}", want.run_id);
        }
        assert_eq!(leaf_echo(&sup), json!({"echo": {"n": 1}}));
    });
}

/// 200 approvals waiting across 50 trees of one supervisor: all listed, no
/// waiting agent counts as live (each gave its slot back: `suspended` after
/// its requests), and deciding every one completes every tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_approvals_across_fifty_trees_are_listed_decided_and_hold_no_slot() {
    let four: Vec<Value> = (0..4)
        .map(|n| json!({"name": "echo", "input": {"n": n}}))
        .collect();
    let model = scripted(json!({"replies": [{"agent": "asker", "steps": [
        {"toolCalls": four},
        {"text": "all done"}
    ]}]}));
    let mut asker = with_echo(template("asker"));
    asker.approve = vec!["echo".into()];
    let catalog = Catalog::builder()
        .model(model as Arc<dyn Model>)
        .tool(echo() as Arc<dyn Tool>)
        .template(asker)
        .build()
        .unwrap();
    let sup = Supervisor::new(catalog, TreeLimits::default());
    let mut rx = sup.subscribe();
    let mut handles = Vec::new();
    for i in 0..50 {
        let request = arbor_supervisor::StartRequest {
            tree_id: Some(format!("t{i}").parse().unwrap()),
            ..crate::common::request("asker", "ask")
        };
        handles.push(sup.start(request).await.unwrap());
    }
    // Every root suspends once its four requests are out.
    let mut seen = Vec::new();
    let mut suspended = std::collections::HashSet::new();
    while suspended.len() < 50 {
        let e = wait_for(&mut rx, &mut seen, |e| {
            matches!(e.kind, EventKind::Suspended)
        })
        .await;
        suspended.insert(e.tree_id.to_string());
    }
    let pending = sup.approvals(None);
    assert_eq!(pending.len(), 200);
    assert_eq!(sup.approvals(Some(&as_tree("t7"))).len(), 4);
    // Live = started, not suspended, not ended: none.
    let mut live = std::collections::HashMap::<String, bool>::new();
    for e in &seen {
        match e.kind {
            EventKind::AgentStarted { .. } | EventKind::Resumed => {
                live.insert(e.run_id.to_string(), true);
            }
            EventKind::Suspended
            | EventKind::AgentFinished { .. }
            | EventKind::AgentFailed { .. }
            | EventKind::AgentCancelled { .. } => {
                live.insert(e.run_id.to_string(), false);
            }
            _ => {}
        }
    }
    assert_eq!(
        live.values().filter(|l| **l).count(),
        0,
        "parked agents hold no slot"
    );
    for p in &pending {
        sup.decide(
            &p.tree_id,
            &p.tool_call_id,
            Decision::Approve { input: None },
        )
        .await
        .unwrap();
    }
    for handle in handles {
        assert_eq!(finish(handle).await.state.status, AgentStatus::Completed);
    }
    assert!(sup.approvals(None).is_empty());
}

/// Issue 34: after an approval with an edited input, the model's history
/// shows the call with the input that ran beside its result, not the
/// model's own input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_approval_shows_the_input_that_ran_in_the_history() {
    let sup = tree(None);
    let mut rx = sup.subscribe();
    let mut seen = Vec::new();
    let handle = start(&sup, "lead", "go").await;
    wait_for(&mut rx, &mut seen, asked).await;
    let call = sup.approvals(Some(&as_tree("t")))[0].tool_call_id.clone();
    let edited = json!({"n": 7});
    sup.decide(
        &as_tree("t"),
        &call,
        Decision::Approve {
            input: Some(edited.clone()),
        },
    )
    .await
    .unwrap();
    finish(handle).await;
    let leaf = sup.finished_state(&rid("t/0.1.1.1")).unwrap();
    let inputs: Vec<Value> = leaf
        .message_history
        .iter()
        .flat_map(|m| m.tool_calls().cloned().collect::<Vec<_>>())
        .filter(|c| c.tool_call_id == call)
        .map(|c| c.input.value())
        .collect();
    assert_eq!(inputs, [edited], "the call as it ran, once");
}

/// Issue 34: a decision on a call of a cancelled tree is refused as ended
/// (409 over HTTP, as documented), not as a call no one knows (404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deciding_a_call_of_a_cancelled_tree_is_refused_as_ended_not_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.db")).unwrap());
    for sup in [tree(None), tree(Some(store))] {
        let mut rx = sup.subscribe();
        let mut seen = Vec::new();
        let handle = start(&sup, "lead", "go").await;
        wait_for(&mut rx, &mut seen, asked).await;
        let call = sup.approvals(Some(&as_tree("t")))[0].tool_call_id.clone();
        handle.cancel();
        let _ = tokio::time::timeout(GUARD, handle.wait()).await;
        sup.until_ended(&as_tree("t")).await;
        sup.flush().await.unwrap();
        let refused = sup
            .decide(&as_tree("t"), &call, Decision::Approve { input: None })
            .await;
        assert!(
            matches!(
                refused,
                Err(Error::DecisionRefused {
                    reason: DecideRefused::Ended,
                    ..
                })
            ),
            "{refused:?}"
        );
    }
}

/// Issue 34: a call asked for again after a restart keeps the age it had:
/// its `requestedMs` is when it was first asked for, not the restart.
#[test]
fn a_pending_approval_keeps_its_age_across_a_restart() {
    let rt = crate::store::runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let first = rt.block_on(async {
        let sup = tree(Some(Arc::new(SqliteStore::open(&path).unwrap())));
        let mut rx = sup.subscribe();
        let mut seen = Vec::new();
        let handle = start(&sup, "lead", "go").await;
        wait_for(&mut rx, &mut seen, asked).await;
        let first = sup.approvals(Some(&as_tree("t")))[0].requested_ms;
        sup.flush().await.unwrap();
        assert_eq!(sup.release().await.unwrap(), vec![as_tree("t")]);
        handle.cancel();
        let _ = tokio::time::timeout(GUARD, handle.wait()).await;
        first
    });
    // The clock has moved on since (not a wait for anything else).
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    while now() <= first {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    rt.block_on(async {
        let sup = tree(Some(Arc::new(SqliteStore::open(&path).unwrap())));
        let mut rx = sup.events().subscribe_tree(&as_tree("t"));
        let mut seen = Vec::new();
        let handle = sup.resume(&as_tree("t")).await.unwrap();
        if sup.approvals(Some(&as_tree("t"))).is_empty() {
            wait_for(&mut rx, &mut seen, asked).await;
        }
        let pending = sup.approvals(Some(&as_tree("t")));
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert_eq!(pending[0].requested_ms, first, "the age it had");
        sup.decide(
            &as_tree("t"),
            &pending[0].tool_call_id,
            Decision::Approve { input: None },
        )
        .await
        .unwrap();
        finish(handle).await;
    });
}

/// Issue 34: 200 calls waiting in one tree need one decision, not 200 (as
/// the OpenAI Agents SDK's `always_approve`): every call of the tool gets it,
/// each journaled as its own `approvalDecided` event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_pending_calls_of_a_tree_are_decided_with_one_decision() {
    let calls: Vec<Value> = (0..200)
        .map(|n| json!({"name": "echo", "input": {"n": n}}))
        .collect();
    let model = scripted(json!({"replies": [{"agent": "asker", "steps": [
        {"toolCalls": calls},
        {"text": "all done"}
    ]}]}));
    let mut asker = with_echo(template("asker"));
    asker.approve = vec!["echo".into()];
    let catalog = Catalog::builder()
        .model(model as Arc<dyn Model>)
        .tool(echo() as Arc<dyn Tool>)
        .template(asker)
        .build()
        .unwrap();
    let sup = Supervisor::new(catalog, TreeLimits::default());
    let mut rx = sup.subscribe();
    let mut seen = Vec::new();
    let handle = start(&sup, "asker", "ask").await;
    wait_for(&mut rx, &mut seen, |e| {
        matches!(e.kind, EventKind::Suspended)
    })
    .await;
    assert_eq!(sup.approvals(Some(&as_tree("t"))).len(), 200);
    // An edited input is one call's; another tool's calls are none.
    assert!(matches!(
        sup.decide_all(
            &as_tree("t"),
            None,
            Decision::Approve {
                input: Some(json!({"n": 0}))
            }
        )
        .await,
        Err(Error::DecisionRefused {
            reason: DecideRefused::InvalidInput(_),
            ..
        })
    ));
    assert!(matches!(
        sup.decide_all(&as_tree("t"), Some("rm"), Decision::Approve { input: None })
            .await,
        Err(Error::UnknownApproval { .. })
    ));
    let decided = sup
        .decide_all(
            &as_tree("t"),
            Some("echo"),
            Decision::Approve { input: None },
        )
        .await
        .unwrap();
    assert_eq!(decided.len(), 200);
    let result = finish(handle).await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    assert!(sup.approvals(None).is_empty());
    seen.extend(drain(&mut rx));
    let journaled = seen
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ApprovalDecided { .. }))
        .count();
    assert_eq!(journaled, 200, "each decision its own event");
}

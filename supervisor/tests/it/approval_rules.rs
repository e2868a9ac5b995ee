//! "Always allow this tool in this tree" (semantics §12, issue 34): one
//! answer approves a waiting call and lets every later call of its tool in
//! the tree run unasked, at any depth and in later turns, from the journal
//! after a restart; another tree still asks.

use std::sync::Arc;
use std::time::Duration;

use arbor_actors::{AgentStatus, Event, EventKind, Model, Tool};
use arbor_supervisor::store::{SqliteStore, Store};
use arbor_supervisor::{Catalog, Supervisor, TreeLimits, TurnRequest, TurnStart};
use serde_json::{Value, json};

use crate::common::*;

/// lead: echo, then a worker (which echoes), then echo again; its second
/// turn echoes once more. Every echo needs approval.
fn supervisor(store: Option<Arc<SqliteStore>>) -> Supervisor {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "prompt": "second", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"n": 4}}]},
            {"text": "second done"}
        ]},
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"n": 1}}]},
            {"toolCalls": [spawn_call(&[("worker", "work")])]},
            {"toolCalls": [{"name": "echo", "input": {"n": 3}}]},
            {"text": "first done"}
        ]},
        {"agent": "worker", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"n": 2}}]},
            {"text": "worker done"}
        ]}
    ]}));
    let mut lead = with_echo(template("lead").spawns(&["worker"]));
    lead.approve = vec!["echo".into()];
    let mut worker = with_echo(template("worker"));
    worker.approve = vec!["echo".into()];
    let catalog = Catalog::builder()
        .model(model as Arc<dyn Model>)
        .tool(echo() as Arc<dyn Tool>)
        .template(lead)
        .template(worker)
        .build()
        .unwrap();
    let sup = Supervisor::new(catalog, TreeLimits::default());
    match store {
        Some(store) => sup.with_store(store).unwrap(),
        None => sup,
    }
}

fn asked(e: &Event) -> bool {
    matches!(e.kind, EventKind::ApprovalRequested { .. })
}

fn count(events: &[Arc<Event>], pred: impl Fn(&Event) -> bool) -> usize {
    events.iter().filter(|e| pred(e)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_always_allowed_tool_runs_unasked_at_any_depth_and_in_a_later_turn_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    {
        let sup = supervisor(Some(Arc::new(SqliteStore::open(&path).unwrap())));
        let mut rx = sup.subscribe();
        let mut seen = Vec::new();
        let handle = start(&sup, "lead", "first").await;
        wait_for(&mut rx, &mut seen, asked).await;
        let pending = sup.approvals(Some(&as_tree("t")));
        assert_eq!(pending.len(), 1, "{pending:?}");
        let call = pending[0].tool_call_id.clone();
        let now = sup.approve_always(&as_tree("t"), &call).await.unwrap();
        assert_eq!(
            (now.tools, now.approved),
            (vec!["echo".to_owned()], vec![call])
        );
        let result = finish(handle).await;
        assert_eq!(result.state.status, AgentStatus::Completed);
        seen.extend(drain(&mut rx));
        assert_eq!(count(&seen, asked), 1, "only the first call was asked");
        assert_eq!(
            count(&seen, |e| matches!(&e.kind,
                EventKind::ApprovalRuleAdded { tool } if tool == "echo")),
            1
        );
        let ran: Vec<Value> = [&result.state]
            .into_iter()
            .flat_map(|s| tool_results(s, "echo"))
            .collect();
        assert_eq!(ran, [json!({"echo": {"n": 1}}), json!({"echo": {"n": 3}})]);
        let worker = sup
            .finished_state(&rid("t/0.1"))
            .expect("the worker finished");
        assert_eq!(tool_result(&worker, "echo"), json!({"echo": {"n": 2}}));
        sup.flush().await.unwrap();
    }
    // Another process on the same store: the rule is read back from the
    // journal; another tree of it still asks.
    let sup = supervisor(Some(Arc::new(SqliteStore::open(&path).unwrap())));
    let mut rx = sup.subscribe();
    let handle = match sup
        .start_turn(&as_tree("t"), TurnRequest::new("second"))
        .await
        .unwrap()
    {
        TurnStart::Started(handle) => handle,
        TurnStart::Queued(q) => panic!("queued: {:?}", q.turn),
    };
    // Bounded: a call asked again would wait for a person for ever.
    let second = within(Duration::from_secs(30), finish(handle)).await;
    assert_eq!(second.state.status, AgentStatus::Completed);
    assert_eq!(
        tool_results(&second.state, "echo").last(),
        Some(&json!({"echo": {"n": 4}}))
    );
    assert_eq!(
        count(&drain(&mut rx), asked),
        0,
        "not asked after the restart"
    );

    let mut other = request("lead", "first");
    other.tree_id = Some("u".parse().unwrap());
    let handle = sup.start(other).await.unwrap();
    let mut seen = Vec::new();
    let request = wait_for(&mut rx, &mut seen, asked).await;
    assert_eq!(&*request.tree_id, "u", "tree u asks: t's rule is t's");
    assert!(!sup.always_allowed(&as_tree("u"), "echo"));
    handle.cancel();
    let _ = tokio::time::timeout(GUARD, handle.wait()).await;
}

/// A replay of a tree whose tool was allowed for good takes the rule from
/// the journal: it asks no one (its later calls have no decision recorded)
/// and every run ends as it did.
#[test]
fn a_replay_of_a_tree_with_an_always_allowed_tool_asks_no_one_and_matches() {
    let rt = crate::store::runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let finals = rt.block_on(async {
        let store = Arc::new(SqliteStore::open(&path).unwrap());
        let sup = supervisor(Some(store.clone()));
        let mut rx = sup.subscribe();
        let mut seen = Vec::new();
        let handle = start(&sup, "lead", "first").await;
        wait_for(&mut rx, &mut seen, asked).await;
        let call = sup.approvals(Some(&as_tree("t")))[0].tool_call_id.clone();
        sup.approve_always(&as_tree("t"), &call).await.unwrap();
        finish(handle).await;
        sup.flush().await.unwrap();
        store.final_states(&as_tree("t")).unwrap()
    });
    rt.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        let (record, _) = store.tree(&as_tree("t")).unwrap();
        let sup = supervisor(None);
        let mut rx = sup.subscribe();
        let handle = sup
            .replay(
                record.request().unwrap(),
                store.recovery(&as_tree("t")).unwrap(),
            )
            .await
            .unwrap();
        // Bounded: a call asked again would wait for a person for ever.
        within(Duration::from_secs(30), finish(handle)).await;
        assert_eq!(count(&drain(&mut rx), asked), 0, "a replay asks no one");
        for want in &finals {
            let got = sup.finished_state(&want.run_id).expect("replayed");
            assert_eq!(*got, *want, "run {}", want.run_id);
        }
    });
}

//! Budgets that pause (semantics §13): with `on_budget = "pause"`, a spent
//! budget parks the agents that need more instead of failing them; raising
//! it lets them go on.

use std::sync::Arc;

use arbor_actors::{AgentStatus, Event, EventKind, Limit, Model, Tool};
use arbor_supervisor::{Catalog, OnBudget, Raised, Supervisor, TreeLimits};
use serde_json::json;

use crate::common::*;

/// Every reply costs one credit: lead spawns two workers (1), each worker
/// calls echo (1) and answers (1), then lead answers (1): 6 in all.
fn spenders(limits: TreeLimits) -> Supervisor {
    let usage = json!({"inputTokens": 10, "outputTokens": 5, "cost": 1.0});
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("worker", "a"), ("worker", "b")])], "usage": usage},
            {"text": "lead done", "usage": usage}
        ]},
        {"agent": "worker", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"n": 1}}], "usage": usage},
            {"text": "worker done", "usage": usage}
        ]}
    ]}));
    let catalog = Catalog::builder()
        .model(model as Arc<dyn Model>)
        .tool(echo() as Arc<dyn Tool>)
        .template(template("lead").spawns(&["worker"]))
        .template(with_echo(template("worker")))
        .build()
        .unwrap();
    Supervisor::new(catalog, limits)
}

fn budget_reached(e: &Event) -> bool {
    matches!(&e.kind, EventKind::BudgetReached { limit } if limit.limit == Limit::CostBudget)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_paused_at_its_credit_limit_goes_on_when_raised_and_spends_what_its_agents_did() {
    // One live slot, so the order is fixed: lead (1 credit), the first
    // worker's two steps (3), then the second worker's first step finds the
    // budget spent and pauses.
    let sup = spenders(TreeLimits {
        max_credits: Some(2.5),
        on_budget: Some(OnBudget::Pause),
        max_live_agents: std::num::NonZeroUsize::new(1),
        ..TreeLimits::default()
    });
    let mut rx = sup.subscribe();
    let mut seen = Vec::new();
    let handle = start(&sup, "lead", "go").await;
    // The second worker pauses, and a paused agent holds no live slot: it
    // is suspended after its budgetReached (awaited, with the test's bound:
    // it is published just after).
    let paused = |seen: &[Arc<Event>]| {
        seen.iter()
            .filter(|e| budget_reached(e))
            .filter(|e| {
                seen.iter()
                    .skip_while(|x| x.seq != e.seq)
                    .skip(1)
                    .any(|x| x.run_id == e.run_id && matches!(x.kind, EventKind::Suspended))
            })
            .count()
    };
    while paused(&seen) < 1 {
        wait_for(&mut rx, &mut seen, |e| {
            budget_reached(e) || matches!(e.kind, EventKind::Suspended)
        })
        .await;
    }
    seen.extend(drain(&mut rx));
    assert!(
        !seen.iter().any(|e| matches!(
            e.kind,
            EventKind::AgentFailed { .. } | EventKind::LimitHit { .. }
        )),
        "paused, not failed"
    );
    let now = sup
        .raise_limits(
            &as_tree("t"),
            Raised::default(),
            Raised {
                max_credits: Some(7.5),
                ..Raised::default()
            },
        )
        .unwrap();
    assert_eq!(now.max_credits, Some(10.0), "2.5 and 7.5 more");
    let result = finish(handle).await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    let events: Vec<_> = seen.into_iter().chain(drain(&mut rx)).collect();
    let finals = final_states(&events);
    let own: f64 = finals.values().map(|s| s.direct_credits_used).sum();
    assert_eq!(result.state.credits_used, 6.0);
    assert_eq!(own, 6.0, "the tree spent what its agents did");
    assert!(
        events.iter().any(
            |e| matches!(e.kind, EventKind::LimitsRaised { max_credits: Some(c), .. } if c == 10.0)
        ),
        "the raise is journaled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_pause_a_spent_budget_still_fails_the_agents_it_refuses() {
    // One live slot: the first worker completes (3 credits), the second's
    // first step finds the budget spent.
    let sup = spenders(TreeLimits {
        max_credits: Some(2.5),
        max_live_agents: std::num::NonZeroUsize::new(1),
        ..TreeLimits::default()
    });
    let result = finish(start(&sup, "lead", "go").await).await;
    let entries = tool_result(&result.state, "spawn_agents");
    assert!(error_of(&entries[0]).is_none(), "{}", entries[0]);
    let error = error_of(&entries[1]).expect("the second worker failed");
    assert!(error.contains("max_credits"), "{error}");
    assert!(matches!(
        sup.raise_limits(&as_tree("t"), Raised::default(), Raised::default()),
        Err(arbor_supervisor::Error::NothingRaised)
    ));
}

/// A paused tree survives its process paused, and keeps a raise made before:
/// handed over while its workers wait (after a raise too small to let them
/// go on), resumed elsewhere, it pauses again with that raise in force; a
/// second raise there completes it.
#[test]
fn a_paused_tree_survives_a_restart_paused_and_keeps_its_raised_budget() {
    use arbor_supervisor::store::SqliteStore;
    let rt = crate::store::runtime();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let limits = TreeLimits {
        max_credits: Some(2.5),
        on_budget: Some(OnBudget::Pause),
        ..TreeLimits::default()
    };
    let stored = |limits: TreeLimits| {
        spenders(limits)
            .with_store(Arc::new(SqliteStore::open(&path).unwrap()))
            .unwrap()
    };
    rt.block_on(async {
        let sup = stored(limits.clone());
        let mut rx = sup.subscribe();
        let mut seen = Vec::new();
        let handle = start(&sup, "lead", "go").await;
        wait_for(&mut rx, &mut seen, budget_reached).await;
        // Half a credit more: still short (3 spent), so it stays paused.
        let add = Raised {
            max_credits: Some(0.5),
            ..Raised::default()
        };
        let now = sup
            .raise_limits(&as_tree("t"), Raised::default(), add)
            .unwrap();
        assert_eq!(now.max_credits, Some(3.0));
        wait_for(&mut rx, &mut seen, |e| {
            matches!(e.kind, EventKind::LimitsRaised { .. })
        })
        .await;
        sup.flush().await.unwrap();
        assert_eq!(sup.release().await.unwrap(), vec![as_tree("t")]);
        handle.cancel();
        let _ = tokio::time::timeout(GUARD, handle.wait()).await;
    });
    rt.block_on(async {
        let sup = stored(limits);
        let mut rx = sup.events().subscribe_tree(&as_tree("t"));
        let mut seen = Vec::new();
        let handle = sup.resume(&as_tree("t")).await.unwrap();
        wait_for(&mut rx, &mut seen, budget_reached).await;
        let add = Raised {
            max_credits: Some(7.0),
            ..Raised::default()
        };
        let now = sup
            .raise_limits(&as_tree("t"), Raised::default(), add)
            .unwrap();
        assert_eq!(now.max_credits, Some(10.0), "the first raise was kept");
        let result = finish(handle).await;
        assert_eq!(result.state.status, AgentStatus::Completed);
        assert_eq!(result.state.credits_used, 6.0);
    });
}

//! Tree-wide and per-agent limits (semantics §8): a spawn over a limit is an
//! `errorMessage`, an exhausted budget fails the agents it affects, naming it.

use std::collections::HashMap;
use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::Arc;
use std::time::Duration;

use arbor_actors::{AgentStatus, Event, EventKind, Limit};
use arbor_supervisor::{StartRequest, TreeLimits};
use serde_json::{Value, json};

use crate::common::*;

fn limit_hits(events: &[Arc<Event>]) -> Vec<Limit> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::LimitHit { limit } => Some(limit.limit),
            _ => None,
        })
        .collect()
}

fn entries(state: &arbor_actors::AgentState) -> Vec<Value> {
    tool_result(state, "spawn_agents")
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test(start_paused = true)]
async fn a_spawn_deeper_than_max_depth_is_an_error_entry() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("mid", "go down")])]},
            {"text": "lead done"}
        ]},
        {"agent": "mid", "steps": [
            {"toolCalls": [spawn_call(&[("leaf", "deeper")])]},
            {"text": "mid done"}
        ]},
        {"agent": "leaf", "steps": [{"text": "too deep"}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![
            template("lead").spawns(&["mid"]),
            template("mid").spawns(&["leaf"]),
            template("leaf"),
        ],
        TreeLimits {
            max_depth: Some(1),
            ..TreeLimits::default()
        },
    );
    let (result, events) = run(&sup, "lead", "go").await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    let mid = sup.finished_state(&result.state.child_run_ids[0]).unwrap();
    assert_eq!(mid.status, AgentStatus::Completed);
    let refused = &entries(&mid)[0];
    let error = error_of(refused).expect("refused");
    assert!(error.contains("max_depth"), "{error}");
    assert!(mid.child_run_ids.is_empty());
    assert!(!model.requests().iter().any(|r| r.agent_type == "leaf"));
    assert_eq!(limit_hits(&events), [Limit::MaxDepth]);
}

#[tokio::test(start_paused = true)]
async fn spawns_past_max_agents_are_error_entries() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("w", "1"), ("w", "2"), ("w", "3"), ("w", "4")])]},
            {"text": "done"}
        ]},
        {"agent": "w", "steps": [{"text": "worked"}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![template("lead").spawns(&["w"]), template("w")],
        TreeLimits {
            max_agents: NonZeroUsize::new(3),
            ..TreeLimits::default()
        },
    );
    let mut rx = sup.subscribe();
    let handle = start(&sup, "lead", "go").await;
    let agents_before = handle.agents();
    let result = finish(handle).await;
    let events = drain(&mut rx);
    assert_eq!(agents_before, 1);
    assert_eq!(result.state.status, AgentStatus::Completed);
    let entries = entries(&result.state);
    assert_eq!(last_text(&entries[0]["value"]), "worked");
    assert_eq!(last_text(&entries[1]["value"]), "worked");
    for refused in &entries[2..] {
        let error = error_of(refused).expect("refused");
        assert!(error.contains("max_agents"), "{error}");
    }
    assert_eq!(result.state.child_run_ids.len(), 2);
    assert_eq!(spawned(&events, "w").len(), 2);
    assert_eq!(limit_hits(&events), [Limit::MaxAgents, Limit::MaxAgents]);
}

#[tokio::test(start_paused = true)]
async fn children_past_max_children_per_call_are_error_entries() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("w", "1"), ("w", "2"), ("w", "3")])]},
            {"toolCalls": [spawn_call(&[("w", "4"), ("w", "5")])]},
            {"text": "done"}
        ]},
        {"agent": "w", "steps": [{"text": "worked"}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![template("lead").spawns(&["w"]), template("w")],
        TreeLimits {
            max_children_per_call: NonZeroUsize::new(2),
            ..TreeLimits::default()
        },
    );
    let (result, events) = run(&sup, "lead", "go").await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    let calls = tool_results(&result.state, "spawn_agents");
    let first = calls[0].as_array().unwrap();
    assert_eq!(last_text(&first[0]["value"]), "worked");
    assert_eq!(last_text(&first[1]["value"]), "worked");
    let error = error_of(&first[2]).expect("refused");
    assert!(error.contains("max_children_per_call"), "{error}");
    // The limit is per call: a later call of two is fine.
    let second = calls[1].as_array().unwrap();
    assert!(second.iter().all(|e| error_of(e).is_none()));
    assert_eq!(result.state.child_run_ids.len(), 4);
    assert_eq!(limit_hits(&events), [Limit::MaxChildrenPerCall]);
}

/// Live agents over time, computed from events, and checks on each run's events.
fn live_profile(events: &[Arc<Event>]) -> (i64, usize) {
    let mut live: i64 = 0;
    let mut max_live = 0;
    let mut per_run: HashMap<&RunId, i64> = HashMap::new();
    let mut finals: HashMap<&RunId, usize> = HashMap::new();
    let mut starts: HashMap<&RunId, usize> = HashMap::new();
    for e in events {
        let delta = match &e.kind {
            EventKind::AgentStarted { .. } => {
                *starts.entry(&e.run_id).or_default() += 1;
                1
            }
            EventKind::Resumed => 1,
            EventKind::Suspended => -1,
            EventKind::AgentFinished { .. }
            | EventKind::AgentFailed { .. }
            | EventKind::AgentCancelled { .. } => {
                *finals.entry(&e.run_id).or_default() += 1;
                -1
            }
            _ => 0,
        };
        let run = per_run.entry(&e.run_id).or_default();
        *run += delta;
        assert!(
            (0..=1).contains(run),
            "{} counted {run} live at seq {}",
            e.run_id,
            e.seq
        );
        live += delta;
        max_live = max_live.max(live);
    }
    assert_eq!(live, 0, "every run ends not live");
    assert!(starts.values().all(|n| *n == 1), "each run starts once");
    assert!(finals.values().all(|n| *n == 1), "each run finishes once");
    assert_eq!(
        starts.keys().collect::<std::collections::BTreeSet<_>>(),
        finals.keys().collect::<std::collections::BTreeSet<_>>()
    );
    (max_live, finals.len())
}

fn fifty_agent_script(delays: bool) -> Value {
    let mids: Vec<(&str, &str)> = (0..7).map(|_| ("mid", "part")).collect();
    let leaves: Vec<(&str, &str)> = (0..6).map(|_| ("leaf", "piece")).collect();
    let d = |ms: u64| if delays { ms } else { 0 };
    json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&mids)]},
            {"text": "tree done"}
        ]},
        {"agent": "mid", "steps": [
            {"toolCalls": [spawn_call(&leaves)], "delayMs": d(5)},
            {"text": "mid done", "delayMs": d(3)}
        ]},
        {"agent": "leaf", "steps": [{"text": "leaf done", "delayMs": d(10)}]}
    ]})
}

fn fifty_agent_templates() -> Vec<arbor_actors::AgentTemplate> {
    vec![
        template("lead").spawns(&["mid"]),
        template("mid").spawns(&["leaf"]),
        template("leaf"),
    ]
}

#[tokio::test(start_paused = true)]
async fn fifty_agents_complete_with_never_more_than_two_live() {
    let model = scripted(fifty_agent_script(true));
    let sup = supervisor(
        &model,
        fifty_agent_templates(),
        TreeLimits {
            max_live_agents: NonZeroUsize::new(2),
            ..TreeLimits::default()
        },
    );
    let mut rx = sup.subscribe();
    let handle = start(&sup, "lead", "go").await;
    let started = tokio::time::Instant::now();
    let result = finish(handle).await;
    let elapsed = started.elapsed();
    let events = drain(&mut rx);
    assert_eq!(result.state.status, AgentStatus::Completed);

    let (max_live, runs) = live_profile(&events);
    assert_eq!(runs, 50);
    assert_eq!(max_live, 2, "the limit is reached and never passed");
    let states = final_states(&events);
    assert!(states.values().all(|s| s.status == AgentStatus::Completed));
    assert_eq!(result.state.child_run_ids.len(), 7);
    // Two at a time: 42 leaves of 10ms take at least 21 rounds.
    assert!(elapsed >= Duration::from_millis(210), "{elapsed:?}");
    assert_eq!(sup.live_actors(), 0);
}

/// The same tree on worker threads with no delays: slots are released and taken
/// truly in parallel, and the events must still never show three live agents.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_slots_hold_on_a_multi_thread_runtime() {
    let model = scripted(fifty_agent_script(false));
    let sup = supervisor(
        &model,
        fifty_agent_templates(),
        TreeLimits {
            max_live_agents: NonZeroUsize::new(2),
            ..TreeLimits::default()
        },
    );
    for i in 0..40 {
        let mut rx = sup.events().subscribe_tree(&as_tree(&format!("mt{i}")));
        let handle = sup
            .start(StartRequest {
                tree_id: Some(format!("mt{i}").parse().unwrap()),
                ..request("lead", "go")
            })
            .await
            .unwrap();
        let result = finish(handle).await;
        assert_eq!(result.state.status, AgentStatus::Completed);
        let (max_live, runs) = live_profile(&drain(&mut rx));
        assert_eq!(runs, 50);
        assert!(max_live <= 2, "tree {i}: {max_live} live");
        assert_eq!(sup.live_actors(), 0, "tree {i}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ends_a_slow_tree_as_failed() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("slow", "take a minute")])]},
            {"text": "never"}
        ]},
        {"agent": "slow", "steps": [{"text": "late", "delayMs": 60000}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![template("lead").spawns(&["slow"]), template("slow")],
        TreeLimits {
            deadline: Some(Duration::from_secs(1)),
            ..TreeLimits::default()
        },
    );
    let started = tokio::time::Instant::now();
    let (result, events) = run(&sup, "lead", "go").await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(2),
        "{elapsed:?}"
    );
    assert_eq!(result.state.status, AgentStatus::Failed);
    let error = result.state.error_message().expect("an error output");
    assert!(error.contains("deadline"), "{error}");
    assert_eq!(result.value["type"], "error");
    assert!(
        result.value["message"]
            .as_str()
            .unwrap()
            .contains("deadline")
    );
    // The child it affected failed too, naming the limit; it is on record.
    assert_eq!(result.state.child_run_ids.len(), 1);
    let slow = sup.finished_state(&result.state.child_run_ids[0]).unwrap();
    assert_eq!(slow.status, AgentStatus::Failed);
    assert!(slow.error_message().unwrap().contains("deadline"));
    assert!(events.iter().any(|e| matches!(
        &e.kind,
        EventKind::AgentFailed { error, .. } if error.contains("deadline")
    )));
    assert_eq!(sup.live_actors(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_step_timeout_fails_an_agent_whose_model_is_slow() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("w", "slow"), ("w", "quick")])]},
            {"text": "done"}
        ]},
        {"agent": "w", "prompt": "slow", "steps": [{"text": "late", "delayMs": 5000}]},
        {"agent": "w", "prompt": "quick", "steps": [{"text": "in time", "delayMs": 100}]}
    ]}));
    let mut w = template("w");
    w.step_timeout = Some(Duration::from_millis(500));
    let sup = supervisor(
        &model,
        vec![template("lead").spawns(&["w"]), w],
        TreeLimits::default(),
    );
    let started = tokio::time::Instant::now();
    let (result, events) = run(&sup, "lead", "go").await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(result.state.status, AgentStatus::Completed);
    let entries = entries(&result.state);
    let error = error_of(&entries[0]).expect("timed out");
    assert!(error.contains("step_timeout"), "{error}");
    assert_eq!(last_text(&entries[1]["value"]), "in time");
    assert_eq!(limit_hits(&events), [Limit::StepTimeout]);
    let slow = sup.finished_state(&result.state.child_run_ids[0]).unwrap();
    assert_eq!(slow.status, AgentStatus::Failed);
}

#[tokio::test(start_paused = true)]
async fn the_tree_step_budget_fails_every_agent_it_stops() {
    let looping: Vec<Value> = (0..10)
        .map(|i| json!({"toolCalls": [{"name": "echo", "input": {"i": i}}], "delayMs": 1}))
        .collect();
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("looper", "a"), ("looper", "b")])]},
            {"text": "never"}
        ]},
        {"agent": "looper", "steps": looping}
    ]}));
    let sup = supervisor(
        &model,
        vec![
            template("lead").spawns(&["looper"]),
            with_echo(template("looper")),
        ],
        TreeLimits {
            max_steps: NonZeroU64::new(4),
            ..TreeLimits::default()
        },
    );
    let mut rx = sup.subscribe();
    let handle = start(&sup, "lead", "go").await;
    let root = handle.root_run_id.clone();
    let result = finish(handle).await;
    let events = drain(&mut rx);
    assert_eq!(model.requests().len(), 4, "exactly the budget of steps");

    assert_eq!(result.state.status, AgentStatus::Failed);
    let error = result.state.error_message().unwrap();
    assert!(error.contains("limit max_steps reached"), "{error}");
    // Nothing accepted is lost: the children's reports are in the root's history.
    for entry in entries(&result.state) {
        let error = error_of(&entry).expect("looper failed");
        assert!(error.contains("limit max_steps reached"), "{error}");
    }
    let states = final_states(&events);
    assert_eq!(states.len(), 3);
    assert!(states.values().all(|s| s.status == AgentStatus::Failed));
    assert_eq!(states[&root].child_run_ids.len(), 2);
    assert_eq!(
        limit_hits(&events)
            .iter()
            .filter(|l| **l == Limit::MaxSteps)
            .count(),
        3
    );
}

#[tokio::test(start_paused = true)]
async fn the_token_budget_fails_the_agents_that_exhaust_it() {
    let usage = json!({"inputTokens": 40, "outputTokens": 20});
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("worker", "spend")])], "usage": usage},
            {"text": "never", "usage": usage}
        ]},
        {"agent": "worker", "steps": [
            {"toolCalls": [{"name": "echo", "input": {}}], "usage": usage},
            {"text": "never", "usage": usage}
        ]}
    ]}));
    let sup = supervisor(
        &model,
        vec![
            template("lead").spawns(&["worker"]),
            with_echo(template("worker")),
        ],
        TreeLimits {
            max_tokens: NonZeroU64::new(100),
            ..TreeLimits::default()
        },
    );
    let mut rx = sup.subscribe();
    let handle = start(&sup, "lead", "go").await;
    let result = finish(handle).await;
    let events = drain(&mut rx);
    assert_eq!(model.requests().len(), 2);

    assert_eq!(result.state.status, AgentStatus::Failed);
    let error = result.state.error_message().unwrap();
    assert!(error.contains("max_tokens"), "{error}");
    let entry = &entries(&result.state)[0];
    let error = error_of(entry).expect("worker failed");
    assert!(error.contains("max_tokens"), "{error}");
    let worker = sup.finished_state(&result.state.child_run_ids[0]).unwrap();
    assert_eq!(worker.status, AgentStatus::Failed);
    // The step it took before the budget ran out is kept.
    assert!(worker.message_history.iter().any(|m| m.answers().is_some()));
    assert_eq!(
        limit_hits(&events),
        [Limit::TokenBudget, Limit::TokenBudget]
    );
}

/// Regression: a parent that gave its live slot back while its children ran used
/// to count its next step twice (once when parked, once when resumed).
#[tokio::test(start_paused = true)]
async fn a_resumed_parent_counts_its_step_once() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("worker", "a"), ("worker", "b")])]},
            {"text": "merged"}
        ]},
        {"agent": "worker", "steps": [{"text": "done", "delayMs": 5}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![template("lead").spawns(&["worker"]), template("worker")],
        TreeLimits {
            // Exactly the four steps the tree takes, with one live slot so the
            // lead is suspended and resumed.
            max_steps: NonZeroU64::new(4),
            max_live_agents: NonZeroUsize::new(1),
            ..TreeLimits::default()
        },
    );
    let handle = start(&sup, "lead", "go").await;
    let result = finish(handle).await;
    assert_eq!(
        result.state.status,
        AgentStatus::Completed,
        "{:?}",
        result.state.output
    );
    assert_eq!(model.requests().len(), 4);
}

/// Tokens of calls in flight are reserved: siblings cannot all start calls the
/// budget cannot pay for.
#[tokio::test(start_paused = true)]
async fn concurrent_calls_reserve_the_token_budget() {
    let long_prompt = "x".repeat(400); // about 100 tokens each
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("worker", &long_prompt), ("worker", &long_prompt), ("worker", &long_prompt)])],
             "usage": {"inputTokens": 1, "outputTokens": 1}},
            {"text": "merged", "usage": {"inputTokens": 1, "outputTokens": 1}}
        ]},
        {"agent": "worker", "steps": [{"text": "done", "delayMs": 50, "usage": {"inputTokens": 100, "outputTokens": 5}}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![template("lead").spawns(&["worker"]), template("worker")],
        TreeLimits {
            max_tokens: NonZeroU64::new(250),
            ..TreeLimits::default()
        },
    );
    let mut rx = sup.subscribe();
    let handle = start(&sup, "lead", "go").await;
    let result = finish(handle).await;
    let events = drain(&mut rx);
    // Two workers fit in the budget at once; the third is refused before its call.
    let refused = limit_hits(&events)
        .iter()
        .filter(|l| **l == Limit::TokenBudget)
        .count();
    assert!(refused >= 1, "the third concurrent call must be refused");
    let worker_requests = model
        .requests()
        .iter()
        .filter(|r| r.agent_type == "worker")
        .count();
    assert_eq!(worker_requests, 2);
    assert_eq!(entries(&result.state).len(), 3);
}

/// Regression: the step timeout covers the step's tools, not the children a
/// spawn in the same step is waiting for (a quick tool used to leave the timer
/// running while slow children worked).
#[tokio::test(start_paused = true)]
async fn a_step_timeout_does_not_time_the_children_of_the_step() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"x": 1}}, spawn_call(&[("slow", "work")])]},
            {"text": "merged"}
        ]},
        {"agent": "slow", "steps": [{"text": "finally", "delayMs": 5000}]}
    ]}));
    let mut lead = with_echo(template("lead").spawns(&["slow"]));
    lead.step_timeout = Some(Duration::from_secs(1));
    let sup = supervisor(&model, vec![lead, template("slow")], TreeLimits::default());
    let (result, _) = run(&sup, "lead", "go").await;
    assert_eq!(
        result.state.status,
        AgentStatus::Completed,
        "{:?}",
        result.state.output
    );
    let entry = &entries(&result.state)[0];
    assert!(error_of(entry).is_none(), "{entry}");
}

/// A tree id names one tree at a time: starting a second tree with the id of a
/// running one is refused (their run ids would collide).
#[tokio::test(start_paused = true)]
async fn a_running_tree_id_cannot_be_reused() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [{"text": "slow", "delayMs": 1000}]}
    ]}));
    let sup = supervisor(&model, vec![template("lead")], TreeLimits::default());
    let first = start(&sup, "lead", "go").await;
    let second = sup.start(request("lead", "again")).await;
    assert!(
        matches!(second, Err(arbor_supervisor::Error::TreeExists(ref id)) if id == "t"),
        "{:?}",
        second.err()
    );
    finish(first).await;
    // Once it has finished, the id is free again.
    finish(start(&sup, "lead", "again").await).await;
}

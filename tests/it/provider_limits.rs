//! A model's limiter and retries under a whole tree, asserted at the server:
//! a 201-agent tree never has more than `max_concurrent` requests in flight,
//! and a 50-agent tree completes although 30 % of the requests fail.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arbor::Config;
use arbor::actors::{AgentStatus, Event, EventKind, RunId, RunResult};
use arbor::supervisor::{StartRequest, Supervisor};
use arbor_test_support::run_request;
use serde_json::json;

use crate::support::{FakeOpenAi, Fault, GUARD, retry_events};

/// A config of three levels on one OpenAI model at `base_url`: the lead spawns
/// `mids` mids, each mid spawns `workers` workers.
fn config(base_url: &str, model_extra: &str, mids: usize, workers: usize) -> Config {
    let text = format!(
        r#"
[limits]
max_depth = 2
max_children_per_call = 64
max_agents = 1000

[models.m]
provider = "openai"
base_url = "{base_url}"
model = "test"
stream = false
{model_extra}

[agents.lead]
model = "m"
system_prompt = "spawn mid {mids}"
spawnable_agents = ["mid"]
max_steps = 4

[agents.mid]
model = "m"
system_prompt = "spawn worker {workers}"
spawnable_agents = ["worker"]
max_steps = 4

[agents.worker]
model = "m"
system_prompt = "answer briefly"
max_steps = 2
"#
    );
    Config::parse(&text, "limits.toml", PathBuf::new()).expect("valid config")
}

/// Runs the lead on a prompt; returns its result and every event of the tree.
async fn run_tree(config: &Config) -> (RunResult, Vec<Arc<Event>>) {
    let supervisor = Supervisor::new(config.catalog().expect("catalog"), config.limits.clone());
    let start = StartRequest {
        agent: "lead".into(),
        prompt: "go".into(),
        ..StartRequest::default()
    };
    run_request(&supervisor, start, GUARD).await
}

/// Every agent started finished and completed; returns how many there were.
fn all_completed(result: &RunResult, events: &[Arc<Event>]) -> usize {
    assert_eq!(
        result.state.status,
        AgentStatus::Completed,
        "{:?}",
        result.state.error_message()
    );
    let started: HashSet<&RunId> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::AgentStarted { .. }))
        .map(|e| &e.run_id)
        .collect();
    let mut ended: HashMap<&RunId, &str> = HashMap::new();
    for e in events {
        if e.kind.final_state().is_some() {
            assert!(
                ended.insert(&e.run_id, e.kind.name()).is_none(),
                "{} ended twice",
                e.run_id
            );
        }
    }
    let not_finished: Vec<_> = ended
        .iter()
        .filter(|(_, name)| **name != "agentFinished")
        .collect();
    assert!(not_finished.is_empty(), "{not_finished:?}");
    assert_eq!(
        started,
        ended.keys().copied().collect::<HashSet<_>>(),
        "every started agent ends"
    );
    for e in events {
        if let EventKind::ChildFinished { status, .. } = &e.kind {
            assert_eq!(*status, AgentStatus::Completed, "{e:?}");
        }
        if let Some(state) = e.kind.final_state() {
            assert_eq!(state.status, AgentStatus::Completed, "{}", state.run_id);
        }
    }
    started.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_201_agent_tree_never_has_more_than_max_concurrent_requests_in_flight() {
    let server = FakeOpenAi::start(Duration::from_millis(5), None).await;
    let config = config(&server.base_url, "limits = { max_concurrent = 8 }", 10, 19);
    let (result, events) = run_tree(&config).await;

    let agents = all_completed(&result, &events);
    assert_eq!(agents, 1 + 10 + 10 * 19);
    let finished = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::AgentFinished { .. }))
        .count();
    assert_eq!(finished, agents);
    assert_eq!(result.state.child_run_ids.len(), 10);
    // Two steps for each of the 11 parents, one for each worker.
    assert_eq!(server.requests(), 11 * 2 + 190);

    let max = server.max_in_flight();
    assert!(max <= 8, "{max} requests were in flight at once");
    assert!(
        max > 1,
        "requests never overlapped ({max}): the test would not catch a broken limiter"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_50_agent_tree_completes_although_30_percent_of_requests_fail() {
    // Requests 0, 3, 6, 10, 13, 16, ... fail: alternately 429 (Retry-After: 0) and 503.
    let faults = Arc::new(|n: usize, _: &str| match n % 10 {
        0 | 6 => Some(Fault {
            status: 429,
            retry_after: Some("0"),
            body: json!({"error": {"message": "rate limited (429)"}}).to_string(),
        }),
        3 => Some(Fault {
            status: 503,
            retry_after: None,
            body: json!({"error": {"message": "overloaded (503)"}}).to_string(),
        }),
        _ => None,
    });
    let server = FakeOpenAi::start(Duration::ZERO, Some(faults)).await;
    let config = config(
        &server.base_url,
        r#"retry = { base_delay = "1ms", max_retries = 8 }"#,
        7,
        6,
    );
    let (result, events) = run_tree(&config).await;

    assert_eq!(all_completed(&result, &events), 1 + 7 + 7 * 6);
    // Two steps for each of the 8 parents, one for each worker, plus the failures.
    let failures = server.failures();
    assert_eq!(server.requests(), 8 * 2 + 42 + failures);
    assert!(
        failures * 10 >= server.requests() * 2,
        "{failures} of {} failed",
        server.requests()
    );

    // One modelRetrying event per failed request, each with the delay it waits.
    let retrying = retry_events(&events);
    assert_eq!(retrying.len(), failures, "{retrying:?}");
    let (mut limited, mut overloaded) = (0, 0);
    for (_, attempt, delay_ms, reason) in &retrying {
        assert!((1..=8).contains(attempt), "{retrying:?}");
        if reason.contains("rate limited (429)") {
            limited += 1;
            assert_eq!(*delay_ms, 0, "Retry-After: 0 is honoured: {reason}");
        } else {
            assert!(reason.contains("overloaded (503)"), "{reason}");
            overloaded += 1;
            // Backoff from 1 ms, doubled per attempt, jittered down.
            assert!(*delay_ms <= 1 << (attempt - 1), "{attempt}: {delay_ms} ms");
        }
    }
    assert!(limited > 0 && overloaded > 0, "{limited} {overloaded}");
    // A retried step still answers once per step.
    let responded = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ModelResponded { .. }))
        .count();
    assert_eq!(responded, 8 * 2 + 42);
}

//! `approval_timeout` (semantics §12): when a step's calls have waited that
//! long for decisions, each call still waiting gets the template's
//! `approval_default`, decided as a person would (an `approvalDecided`
//! event); a decision that comes first stops the timer.

use std::sync::Arc;
use std::time::Duration;

use arbor_actors::approval::{ApprovalDefault, Decision};
use arbor_actors::message::Message;
use arbor_actors::models::scripted::ScriptedModel;
use arbor_actors::{AgentStatus, Event, EventKind};
use arbor_supervisor::{Supervisor, TreeLimits};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::common::*;

const TIMEOUT: Duration = Duration::from_secs(60);

/// One worker whose `echo` calls need approval, within `approval_timeout =
/// 1m`; its step 1 makes `calls` echo calls, its step 2 (after `delay_ms`)
/// answers.
fn worker(
    default: ApprovalDefault,
    calls: &[Value],
    delay_ms: u64,
) -> (Supervisor, Arc<ScriptedModel>) {
    let model = scripted(json!({"replies": [
        {"agent": "worker", "steps": [
            {"text": "Writing.", "toolCalls": calls},
            {"text": "worker done", "delayMs": delay_ms}
        ]}
    ]}));
    let mut t = with_echo(template("worker"));
    t.approve = vec!["echo".into()];
    t.approval_timeout = Some(TIMEOUT);
    t.approval_default = default;
    let sup = supervisor(&model, vec![t], TreeLimits::default());
    (sup, model)
}

/// Every `approvalDecided` event: (call id, decision).
fn decisions(events: &[Arc<Event>]) -> Vec<(String, Decision)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ApprovalDecided {
                tool_call_id,
                decision,
                ..
            } => Some((tool_call_id.clone(), decision.clone())),
            _ => None,
        })
        .collect()
}

fn asked(e: &Event) -> bool {
    matches!(e.kind, EventKind::ApprovalRequested { .. })
}

/// The `errorMessage` of each error result in `messages`.
fn errors(messages: &[Arc<Message>]) -> Vec<String> {
    messages
        .iter()
        .filter(|m| is_tool_error(m))
        .map(|m| {
            let v: Value = serde_json::from_str(&m.text()).unwrap();
            v["errorMessage"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_call_no_one_decides_is_denied_at_the_timeout_and_the_model_reads_why() {
    let (sup, model) = worker(ApprovalDefault::Deny, &[call("echo", json!({"n": 1}))], 0);
    let started = Instant::now();
    let (result, events) = run(&sup, "worker", "go").await;
    assert_eq!(
        started.elapsed(),
        TIMEOUT,
        "decided at the timeout, not before"
    );
    assert_eq!(result.state.status, AgentStatus::Completed);
    let reason = "no decision within 1m (approval_timeout)";
    let decided = decisions(&events);
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert_eq!(
        decided[0].1,
        Decision::Deny {
            reason: reason.into()
        }
    );
    // The step's second model call reads the denial as the call's result.
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        errors(&requests[1].messages),
        [format!("The user denied this tool call: {reason}")]
    );
    assert!(
        tool_results(&result.state, "echo")
            .iter()
            .all(|r| r.get("echo").is_none()),
        "the tool never ran"
    );
    assert!(sup.approvals(None).is_empty());
    assert_eq!(sup.live_actors(), 0);
}

#[tokio::test(start_paused = true)]
async fn with_approval_default_approve_the_call_runs_at_the_timeout() {
    let (sup, model) = worker(
        ApprovalDefault::Approve,
        &[call("echo", json!({"n": 1}))],
        0,
    );
    let started = Instant::now();
    let (result, events) = run(&sup, "worker", "go").await;
    assert_eq!(started.elapsed(), TIMEOUT);
    assert_eq!(result.state.status, AgentStatus::Completed);
    let decided = decisions(&events);
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert_eq!(decided[0].1, Decision::Approve { input: None });
    assert_eq!(
        tool_results(&result.state, "echo"),
        [json!({"echo": {"n": 1}})],
        "it ran once, with the model's input"
    );
    assert!(errors(&model.requests()[1].messages).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_decision_before_the_timeout_stops_it() {
    // The next step takes 2m, so the run is alive well past the timeout.
    let (sup, _model) = worker(
        ApprovalDefault::Deny,
        &[call("echo", json!({"n": 1}))],
        120_000,
    );
    let mut rx = sup.subscribe();
    let mut seen = Vec::new();
    let started = Instant::now();
    let handle = start(&sup, "worker", "go").await;
    wait_for(&mut rx, &mut seen, asked).await;
    tokio::time::sleep_until(started + TIMEOUT / 2).await;
    let call_id = sup.approvals(Some(&as_tree("t")))[0].tool_call_id.clone();
    sup.decide(&as_tree("t"), &call_id, Decision::Approve { input: None })
        .await
        .unwrap();
    let result = finish(handle).await;
    seen.extend(drain(&mut rx));
    assert_eq!(started.elapsed(), TIMEOUT / 2 + Duration::from_secs(120));
    assert_eq!(result.state.status, AgentStatus::Completed);
    assert_eq!(
        decisions(&seen),
        [(call_id, Decision::Approve { input: None })],
        "the person's decision only: none at the timeout"
    );
    assert_eq!(
        tool_results(&result.state, "echo"),
        [json!({"echo": {"n": 1}})],
        "the tool ran once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_step_whose_calls_are_partly_decided_gets_the_default_for_the_rest_at_the_timeout() {
    let calls = [call("echo", json!({"n": 1})), call("echo", json!({"n": 2}))];
    let (sup, _model) = worker(ApprovalDefault::Deny, &calls, 0);
    let mut rx = sup.subscribe();
    let mut seen = Vec::new();
    let started = Instant::now();
    let handle = start(&sup, "worker", "go").await;
    wait_for(&mut rx, &mut seen, asked).await;
    tokio::time::sleep_until(started + TIMEOUT / 2).await;
    let pending = sup.approvals(Some(&as_tree("t")));
    assert_eq!(pending.len(), 2, "{pending:?}");
    let first = pending
        .iter()
        .find(|p| p.input == json!({"n": 1}))
        .unwrap()
        .tool_call_id
        .clone();
    sup.decide(&as_tree("t"), &first, Decision::Approve { input: None })
        .await
        .unwrap();
    let result = finish(handle).await;
    seen.extend(drain(&mut rx));
    // The wait is the step's: one decision does not start it again.
    assert_eq!(started.elapsed(), TIMEOUT);
    let decided = decisions(&seen);
    assert_eq!(decided.len(), 2, "{decided:?}");
    assert_eq!(decided[0], (first, Decision::Approve { input: None }));
    assert!(
        matches!(&decided[1].1, Decision::Deny { reason } if reason.contains("approval_timeout")),
        "{decided:?}"
    );
    assert_eq!(
        tool_results(&result.state, "echo")[0],
        json!({"echo": {"n": 1}}),
        "the approved call ran"
    );
    assert_eq!(
        errors(&result.state.message_history.to_vec()).len(),
        1,
        "the other was denied"
    );
}

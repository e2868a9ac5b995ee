//! The child table without a runtime: each case feeds inputs and checks the
//! outputs of each, rendered as short lines. Cases named after a runtime test
//! of `supervisor/tests/` mirror its supervision part (the parent's view).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::io::ChildId;
use super::*;
use crate::history::History;
use crate::hooks::RunIds;
use crate::limit::LimitHit;
use crate::message::Message;
use crate::spawn::{ChildPlan, SpawnPlan};
use crate::state::AgentState;
use crate::template::AgentTemplate;
use crate::toolbox::Toolbox;

type Table = Children<u32>;

const STEP: u32 = 1;

/// The agent id of the root's `ordinal`-th child, as the supervisor gives it:
/// `t/0.N` (its retries run as `t/0.N~A`).
fn agent_id(ordinal: u32) -> RunId {
    format!("t/0.{ordinal}").parse().unwrap()
}

/// Child `child`, attempt `attempt`, of call 0 of step 1.
fn key(child: usize, attempt: u32) -> ChildKey {
    key_in(0, child, attempt)
}

fn key_in(call: usize, child: usize, attempt: u32) -> ChildKey {
    ChildKey {
        step: STEP,
        call,
        child,
        attempt,
    }
}

fn toolbox() -> Arc<Toolbox> {
    Arc::new(Toolbox::build(&AgentTemplate::new("x", "m"), |_| None).unwrap())
}

fn parent() -> Arc<ParentInfo> {
    Arc::new(ParentInfo {
        agent_id: "t/0".parse().unwrap(),
        run_id: "t/0".parse().unwrap(),
        lineage: ["t/0".parse().unwrap()].into(),
        system_prompt: Arc::from(""),
        context_token_count: 0,
        toolbox: toolbox(),
    })
}

fn admitted(agent_type: &str, ordinal: u32, policy: FailurePolicy, inline: bool) -> Admission {
    Admission::Admitted {
        plan: ChildPlan {
            agent_type: agent_type.into(),
            template: Arc::new(AgentTemplate::new(agent_type, "m").failure(policy)),
            prompt: None,
            params: None,
            snapshot: Arc::new(History::new()),
            notice: None,
            inline,
        },
        toolbox: toolbox(),
        id: agent_id(ordinal),
    }
}

/// An admitted child with the `report` policy.
fn child(agent_type: &str, ordinal: u32) -> Admission {
    admitted(agent_type, ordinal, FailurePolicy::Report, false)
}

fn with_policy(agent_type: &str, ordinal: u32, policy: FailurePolicy) -> Admission {
    admitted(agent_type, ordinal, policy, false)
}

fn retry(max: u32, backoff_ms: u64) -> FailurePolicy {
    FailurePolicy::Retry {
        max,
        backoff: Duration::from_millis(backoff_ms),
    }
}

fn refused(agent_type: &str, error: &str) -> Admission {
    Admission::Refused {
        agent_type: agent_type.into(),
        error: error.into(),
    }
}

fn open(call: usize, children: Vec<Admission>) -> Input<u32> {
    Input::Open {
        step: STEP,
        call,
        inline: false,
        background: false,
        parent: parent(),
        children,
        planner: None,
    }
}

fn open_inline(child: Admission) -> Input<u32> {
    Input::Open {
        step: STEP,
        call: 0,
        inline: true,
        background: false,
        parent: parent(),
        children: vec![child],
        planner: None,
    }
}

fn started(key: ChildKey, actor: u32) -> Input<u32> {
    Input::Started { key, actor }
}

fn result(status: AgentStatus, value: Value, credits: f64) -> RunResult {
    let history: History = [Message::user("prompt"), Message::assistant_text("reply")]
        .into_iter()
        .collect();
    RunResult {
        state: Arc::new(AgentState {
            status,
            credits_used: credits,
            message_history: history,
            ..AgentState::of_run("t/0".parse().unwrap())
        }),
        value,
    }
}

/// The child's actor ended completed, with output `text`.
fn ok(key: ChildKey, actor: u32, text: &str) -> Input<u32> {
    Input::Ended {
        key,
        actor,
        result: result(AgentStatus::Completed, json!(text), 0.0),
    }
}

/// The child's actor ended failed (it ran, then failed with `error`).
fn failed(key: ChildKey, actor: u32, error: &str) -> Input<u32> {
    failed_costing(key, actor, error, 0.0)
}

fn failed_costing(key: ChildKey, actor: u32, error: &str, credits: f64) -> Input<u32> {
    Input::Ended {
        key,
        actor,
        result: result(
            AgentStatus::Failed,
            json!({"type": "error", "message": error}),
            credits,
        ),
    }
}

fn cancelled(key: ChildKey, actor: u32) -> Input<u32> {
    Input::Ended {
        key,
        actor,
        result: result(
            AgentStatus::Cancelled,
            json!({"type": "error", "message": "Agent was cancelled"}),
            0.0,
        ),
    }
}

fn lost(actor: u32, error: &str) -> Input<u32> {
    Input::Lost {
        actor,
        error: error.into(),
    }
}

fn not_started(key: ChildKey) -> Input<u32> {
    Input::NotStarted {
        key,
        error: "cancelled before it started".into(),
    }
}

fn due(key: ChildKey) -> Input<u32> {
    Input::RetryDue { key }
}

fn cancel(run_id: &str) -> Input<u32> {
    Input::Cancel {
        run_id: run_id.parse().unwrap(),
    }
}

/// The parent ended by itself (it failed, or completed).
fn parent_ended() -> Input<u32> {
    Input::ParentEnded { cancelled: None }
}

fn parent_cancelled(reason: CancelReason) -> Input<u32> {
    Input::ParentEnded {
        cancelled: Some(reason),
    }
}

fn show_key(k: &ChildKey) -> String {
    format!("{}.{}.{}#{}", k.step, k.call, k.child, k.attempt)
}

fn show_status(status: AgentStatus) -> String {
    format!("{status:?}").to_lowercase()
}

fn show_reason(reason: &CancelReason) -> String {
    match reason {
        CancelReason::Requested => "requested".into(),
        CancelReason::ParentEnded => "parent ended".into(),
        CancelReason::Limit(limit) => format!("limit {limit}"),
        CancelReason::Failed(failure) => format!("failed: {failure}"),
    }
}

fn show_report(r: &ChildReport) -> String {
    let runs = if r.run_ids.is_empty() {
        "-".to_owned()
    } else {
        join(&r.run_ids)
    };
    let value = match r.error_message() {
        Some(error) => error.to_owned(),
        None => r.value.to_string(),
    };
    let mut line = format!("{runs} {} {value}", show_status(r.status));
    if r.credits != 0.0 {
        line.push_str(&format!(" ({} credits)", r.credits));
    }
    if r.history.is_some() {
        line.push_str(" +history");
    }
    line
}

fn show(output: &Output<u32>) -> String {
    match output {
        Output::Emit(EventKind::ChildSpawned {
            child_run_id,
            agent_type,
            attempt,
        }) => format!("spawned {child_run_id} ({agent_type}, attempt {attempt})"),
        Output::Emit(EventKind::ChildFinished {
            child_run_id,
            status,
        }) => format!("finished {child_run_id} {}", show_status(*status)),
        Output::Emit(EventKind::ChildRetrying {
            failed_run_id,
            attempt,
            delay_ms,
            error,
        }) => format!("retrying {failed_run_id} as attempt {attempt} in {delay_ms}ms: {error}"),
        Output::Emit(other) => format!("event {}", other.name()),
        Output::Wait => "wait".into(),
        Output::Report(report) => format!(
            "report {} {}",
            join(&report.run_ids),
            show_status(report.status)
        ),
        Output::Launch(launch) => {
            let runs: Vec<String> = launch
                .children
                .iter()
                .map(|s| s.ids(&launch.parent.run_id).run_id.to_string())
                .collect();
            let stream = match launch.stream {
                Some(s) => format!(", {} in all", s.line),
                None => String::new(),
            };
            format!(
                "launch {} at depth {}{stream}",
                runs.join(", "),
                launch.priority.depth
            )
        }
        Output::More {
            call,
            children,
            last,
        } => {
            let keys: Vec<String> = children.iter().map(|s| show_key(&s.key)).collect();
            let last = if *last { ", the last" } else { "" };
            format!("more for {}.{}: {}{last}", call.0, call.1, keys.join(", "))
        }
        Output::Skip { run_id } => format!("skip {run_id}"),
        Output::Cancel { actor, reason } => {
            format!("cancel actor {actor}: {}", show_reason(reason))
        }
        Output::Retry { key, delay } => format!("retry {} in {delay:?}", show_key(key)),
        Output::StopRetry { key } => format!("stop retry {}", show_key(key)),
        Output::Deliver(d) => {
            let reports: Vec<String> = d.reports.iter().map(show_report).collect();
            let kind = if d.inline { "inline " } else { "" };
            format!(
                "deliver {kind}{}.{} [{}]",
                d.step,
                d.call,
                reports.join("; ")
            )
        }
        Output::Fail { failure } => format!("fail: {failure}"),
    }
}

/// Feeds each input to one table and checks the outputs it answers, in
/// order; returns the table for checks of what it holds.
fn check(steps: Vec<(Input<u32>, &[&str])>) -> Table {
    let mut table = Table::default();
    for (i, (input, expected)) in steps.into_iter().enumerate() {
        let shown_input = format!("{input:?}");
        let got: Vec<String> = table.handle(input).iter().map(show).collect();
        assert_eq!(
            got,
            expected,
            "outputs of input {i}: {}",
            shown_input.chars().take(120).collect::<String>()
        );
    }
    table
}

fn late(table: &Table) -> Vec<(usize, Vec<String>)> {
    table
        .undelivered()
        .into_iter()
        .map(|(index, _, runs)| (index, runs.iter().map(ToString::to_string).collect()))
        .collect()
}

/// Run ids as one text, joined by commas.
fn join(runs: &[RunId]) -> String {
    runs.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| (*s).to_owned()).collect()
}

// ---- retry, escalate, report ----

/// Mirrors failure.rs `retry_runs_again_with_doubling_backoff_and_records_every_attempt`
/// (the child that works the second time).
#[test]
fn retry_with_doubling_backoff_then_success() {
    let table = check(vec![
        (
            open(0, vec![with_policy("once", 1, retry(3, 100))]),
            &[
                "wait",
                "spawned t/0.1 (once, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (
            failed(key(0, 0), 1, "first call fails"),
            &[
                "finished t/0.1 failed",
                "retrying t/0.1 as attempt 1 in 100ms: first call fails",
                "retry 1.0.0#1 in 100ms",
            ],
        ),
        (
            due(key(0, 1)),
            &[
                "spawned t/0.1~1 (once, attempt 1)",
                "launch t/0.1~1 at depth 1",
            ],
        ),
        (started(key(0, 1), 2), &[]),
        (
            lost(2, "agent panicked: again"),
            &[
                "finished t/0.1~1 failed",
                "retrying t/0.1~1 as attempt 2 in 200ms: agent panicked: again",
                "retry 1.0.0#2 in 200ms",
            ],
        ),
        (
            due(key(0, 2)),
            &[
                "spawned t/0.1~2 (once, attempt 2)",
                "launch t/0.1~2 at depth 1",
            ],
        ),
        (started(key(0, 2), 3), &[]),
        (
            ok(key(0, 2), 3, "finally"),
            &[
                "finished t/0.1~2 completed",
                "deliver 1.0 [t/0.1,t/0.1~1,t/0.1~2 completed \"finally\"]",
            ],
        ),
    ]);
    assert_eq!(table.outstanding(), 0);
}

/// Mirrors failure.rs `retry_runs_again_with_doubling_backoff_and_records_every_attempt`
/// (the doomed child, next to the one that works the second time).
#[test]
fn retry_exhausted_is_a_reported_failure_with_every_attempt() {
    check(vec![
        (
            open(
                0,
                vec![
                    with_policy("doomed", 1, retry(2, 100)),
                    with_policy("once", 2, retry(2, 100)),
                ],
            ),
            &[
                "wait",
                "spawned t/0.1 (doomed, attempt 0)",
                "spawned t/0.2 (once, attempt 0)",
                "launch t/0.1, t/0.2 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (started(key(1, 0), 2), &[]),
        (
            failed(key(0, 0), 1, "always down"),
            &[
                "finished t/0.1 failed",
                "retrying t/0.1 as attempt 1 in 100ms: always down",
                "retry 1.0.0#1 in 100ms",
            ],
        ),
        (
            failed(key(1, 0), 2, "first call fails"),
            &[
                "finished t/0.2 failed",
                "retrying t/0.2 as attempt 1 in 100ms: first call fails",
                "retry 1.0.1#1 in 100ms",
            ],
        ),
        (
            due(key(1, 1)),
            &[
                "spawned t/0.2~1 (once, attempt 1)",
                "launch t/0.2~1 at depth 1",
            ],
        ),
        (
            due(key(0, 1)),
            &[
                "spawned t/0.1~1 (doomed, attempt 1)",
                "launch t/0.1~1 at depth 1",
            ],
        ),
        (started(key(1, 1), 3), &[]),
        (started(key(0, 1), 4), &[]),
        (ok(key(1, 1), 3, "finally"), &["finished t/0.2~1 completed"]),
        (
            failed(key(0, 1), 4, "always down"),
            &[
                "finished t/0.1~1 failed",
                "retrying t/0.1~1 as attempt 2 in 200ms: always down",
                "retry 1.0.0#2 in 200ms",
            ],
        ),
        (
            due(key(0, 2)),
            &[
                "spawned t/0.1~2 (doomed, attempt 2)",
                "launch t/0.1~2 at depth 1",
            ],
        ),
        (started(key(0, 2), 5), &[]),
        (
            failed(key(0, 2), 5, "always down"),
            &[
                "finished t/0.1~2 failed",
                "deliver 1.0 [t/0.1,t/0.1~1,t/0.1~2 failed always down; \
                 t/0.2,t/0.2~1 completed \"finally\"]",
            ],
        ),
    ]);
}

#[test]
fn the_backoff_doubles_from_the_template_backoff_per_attempt() {
    let mut steps: Vec<(Input<u32>, &[&str])> = vec![(
        open(0, vec![with_policy("w", 1, retry(3, 10))]),
        &[
            "wait",
            "spawned t/0.1 (w, attempt 0)",
            "launch t/0.1 at depth 1",
        ],
    )];
    let delays: [&[&str]; 3] = [
        &[
            "finished t/0.1 failed",
            "retrying t/0.1 as attempt 1 in 10ms: down",
            "retry 1.0.0#1 in 10ms",
        ],
        &[
            "finished t/0.1~1 failed",
            "retrying t/0.1~1 as attempt 2 in 20ms: down",
            "retry 1.0.0#2 in 20ms",
        ],
        &[
            "finished t/0.1~2 failed",
            "retrying t/0.1~2 as attempt 3 in 40ms: down",
            "retry 1.0.0#3 in 40ms",
        ],
    ];
    let launches: [&[&str]; 3] = [
        &[
            "spawned t/0.1~1 (w, attempt 1)",
            "launch t/0.1~1 at depth 1",
        ],
        &[
            "spawned t/0.1~2 (w, attempt 2)",
            "launch t/0.1~2 at depth 1",
        ],
        &[
            "spawned t/0.1~3 (w, attempt 3)",
            "launch t/0.1~3 at depth 1",
        ],
    ];
    for attempt in 0..3u32 {
        let actor = attempt + 1;
        steps.push((started(key(0, attempt), actor), &[]));
        steps.push((
            failed(key(0, attempt), actor, "down"),
            delays[attempt as usize],
        ));
        steps.push((due(key(0, attempt + 1)), launches[attempt as usize]));
    }
    steps.push((started(key(0, 3), 4), &[]));
    steps.push((
        failed(key(0, 3), 4, "down"),
        &[
            "finished t/0.1~3 failed",
            "deliver 1.0 [t/0.1,t/0.1~1,t/0.1~2,t/0.1~3 failed down]",
        ],
    ));
    check(steps);
}

#[test]
fn every_attempts_credits_are_in_the_report() {
    check(vec![
        (
            open(0, vec![with_policy("w", 1, retry(1, 10))]),
            &[
                "wait",
                "spawned t/0.1 (w, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (
            failed_costing(key(0, 0), 1, "down", 1.5),
            &[
                "finished t/0.1 failed",
                "retrying t/0.1 as attempt 1 in 10ms: down",
                "retry 1.0.0#1 in 10ms",
            ],
        ),
        (
            due(key(0, 1)),
            &[
                "spawned t/0.1~1 (w, attempt 1)",
                "launch t/0.1~1 at depth 1",
            ],
        ),
        (started(key(0, 1), 2), &[]),
        (
            failed_costing(key(0, 1), 2, "down again", 2.0),
            &[
                "finished t/0.1~1 failed",
                "deliver 1.0 [t/0.1,t/0.1~1 failed down again (3.5 credits)]",
            ],
        ),
    ]);
}

/// Mirrors failure.rs `escalate_fails_the_parent_and_cancels_its_other_children`
/// (the lead's view: `bad` escalates, `slow` is cancelled, both stay on record).
#[test]
fn escalate_fails_the_parent_and_cancels_its_other_children() {
    let table = check(vec![
        (
            open(
                0,
                vec![
                    with_policy("bad", 1, FailurePolicy::Escalate),
                    child("slow", 2),
                ],
            ),
            &[
                "wait",
                "spawned t/0.1 (bad, attempt 0)",
                "spawned t/0.2 (slow, attempt 0)",
                "launch t/0.1, t/0.2 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (started(key(1, 0), 2), &[]),
        (
            failed(key(0, 0), 1, "fatal"),
            &[
                "finished t/0.1 failed",
                "fail: child bad (t/0.1) failed: fatal",
            ],
        ),
        // The machine fails; the driver ends the parent's children.
        (parent_ended(), &["cancel actor 2: parent ended"]),
        (cancelled(key(1, 0), 2), &["finished t/0.2 cancelled"]),
    ]);
    assert_eq!(table.outstanding(), 0);
    assert_eq!(
        late(&table),
        vec![(0, strings(&["t/0.1"])), (0, strings(&["t/0.2"]))]
    );
}

#[test]
fn an_escalating_child_that_fails_after_its_parent_ended_is_only_recorded() {
    let table = check(vec![
        (
            open(0, vec![with_policy("bad", 1, FailurePolicy::Escalate)]),
            &[
                "wait",
                "spawned t/0.1 (bad, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (
            parent_cancelled(CancelReason::Requested),
            &["cancel actor 1: requested"],
        ),
        (failed(key(0, 0), 1, "fatal"), &["finished t/0.1 failed"]),
    ]);
    assert_eq!(late(&table), vec![(0, strings(&["t/0.1"]))]);
}

/// Mirrors failure.rs `panics_errors_and_step_limits_are_error_values_beside_a_working_sibling`.
#[test]
fn panics_errors_and_step_limits_are_error_values_beside_a_working_sibling() {
    check(vec![
        (
            open(
                0,
                vec![
                    child("worker", 1),
                    child("worker", 2),
                    child("looper", 3),
                    child("worker", 4),
                ],
            ),
            &[
                "wait",
                "spawned t/0.1 (worker, attempt 0)",
                "spawned t/0.2 (worker, attempt 0)",
                "spawned t/0.3 (looper, attempt 0)",
                "spawned t/0.4 (worker, attempt 0)",
                "launch t/0.1, t/0.2, t/0.3, t/0.4 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (started(key(1, 0), 2), &[]),
        (started(key(2, 0), 3), &[]),
        (started(key(3, 0), 4), &[]),
        (
            failed(key(2, 0), 3, "limit max_steps (agent) reached"),
            &["finished t/0.3 failed"],
        ),
        (
            failed(key(0, 0), 1, "model panicked: model blew up"),
            &["finished t/0.1 failed"],
        ),
        (
            failed(key(1, 0), 2, "service down"),
            &["finished t/0.2 failed"],
        ),
        (
            ok(key(3, 0), 4, "all good"),
            &[
                "finished t/0.4 completed",
                "deliver 1.0 [t/0.1 failed model panicked: model blew up; \
                 t/0.2 failed service down; \
                 t/0.3 failed limit max_steps (agent) reached; \
                 t/0.4 completed \"all good\"]",
            ],
        ),
    ]);
}

/// Mirrors failure.rs `a_panicking_tool_fails_its_agent_not_the_process`.
#[test]
fn a_panicking_tool_fails_its_agent_not_the_process() {
    check(vec![
        (
            open(0, vec![child("bomber", 1), child("worker", 2)]),
            &[
                "wait",
                "spawned t/0.1 (bomber, attempt 0)",
                "spawned t/0.2 (worker, attempt 0)",
                "launch t/0.1, t/0.2 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (started(key(1, 0), 2), &[]),
        (ok(key(1, 0), 2, "calm"), &["finished t/0.2 completed"]),
        (
            failed(key(0, 0), 1, "a tool panicked: bomb went off"),
            &[
                "finished t/0.1 failed",
                "deliver 1.0 [t/0.1 failed a tool panicked: bomb went off; \
                 t/0.2 completed \"calm\"]",
            ],
        ),
    ]);
}

/// Mirrors failure.rs `a_panicking_step_handler_fails_its_agent_and_the_parent_goes_on`.
#[test]
fn a_panicking_step_handler_fails_its_agent_and_the_parent_goes_on() {
    check(vec![
        (
            open(0, vec![child("prog", 1), child("worker", 2)]),
            &[
                "wait",
                "spawned t/0.1 (prog, attempt 0)",
                "spawned t/0.2 (worker, attempt 0)",
                "launch t/0.1, t/0.2 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (started(key(1, 0), 2), &[]),
        (
            failed(key(0, 0), 1, "agent panicked: program bug"),
            &["finished t/0.1 failed"],
        ),
        (
            ok(key(1, 0), 2, "calm"),
            &[
                "finished t/0.2 completed",
                "deliver 1.0 [t/0.1 failed agent panicked: program bug; \
                 t/0.2 completed \"calm\"]",
            ],
        ),
    ]);
}

/// A panic in the actor outside the guarded code: the child dies without a
/// result, and is reported failed (the report policy).
#[test]
fn a_child_lost_without_a_result_is_a_reported_failure() {
    let table = check(vec![
        (
            open(0, vec![child("w", 1)]),
            &[
                "wait",
                "spawned t/0.1 (w, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (
            lost(1, "agent panicked: boom"),
            &[
                "finished t/0.1 failed",
                "deliver 1.0 [t/0.1 failed agent panicked: boom]",
            ],
        ),
    ]);
    assert_eq!(table.live_count(), 0);
}

#[test]
fn a_child_that_could_not_start_is_reported_without_a_run() {
    check(vec![
        (
            open(0, vec![child("w", 1)]),
            &[
                "wait",
                "spawned t/0.1 (w, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (
            Input::NotStarted {
                key: key(0, 0),
                error: "could not start: boom".into(),
            },
            &[
                "finished t/0.1 failed",
                "deliver 1.0 [- failed could not start: boom]",
            ],
        ),
    ]);
}

// ---- delivery ----

#[test]
fn delivery_waits_for_every_child_and_keeps_request_order() {
    let table = check(vec![
        (
            open(0, vec![child("a", 1), child("b", 2), child("c", 3)]),
            &[
                "wait",
                "spawned t/0.1 (a, attempt 0)",
                "spawned t/0.2 (b, attempt 0)",
                "spawned t/0.3 (c, attempt 0)",
                "launch t/0.1, t/0.2, t/0.3 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (started(key(1, 0), 2), &[]),
        (started(key(2, 0), 3), &[]),
        (ok(key(2, 0), 3, "c"), &["finished t/0.3 completed"]),
        (ok(key(0, 0), 1, "a"), &["finished t/0.1 completed"]),
        (
            ok(key(1, 0), 2, "b"),
            &[
                "finished t/0.2 completed",
                "deliver 1.0 [t/0.1 completed \"a\"; t/0.2 completed \"b\"; t/0.3 completed \"c\"]",
            ],
        ),
    ]);
    assert_eq!(table.outstanding(), 0);
    assert!(table.undelivered().is_empty());
}

#[test]
fn each_spawn_call_is_delivered_when_its_own_children_are_done() {
    check(vec![
        (
            open(0, vec![child("slow", 1)]),
            &[
                "wait",
                "spawned t/0.1 (slow, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (
            open(1, vec![child("fast", 2)]),
            &[
                "wait",
                "spawned t/0.2 (fast, attempt 0)",
                "launch t/0.2 at depth 1",
            ],
        ),
        (started(key_in(0, 0, 0), 1), &[]),
        (started(key_in(1, 0, 0), 2), &[]),
        (
            ok(key_in(1, 0, 0), 2, "fast"),
            &[
                "finished t/0.2 completed",
                "deliver 1.1 [t/0.2 completed \"fast\"]",
            ],
        ),
        (
            ok(key_in(0, 0, 0), 1, "slow"),
            &[
                "finished t/0.1 completed",
                "deliver 1.0 [t/0.1 completed \"slow\"]",
            ],
        ),
    ]);
}

#[test]
fn refused_children_keep_their_place_and_a_call_of_only_refused_ones_is_delivered_at_once() {
    check(vec![
        (
            open(
                0,
                vec![
                    refused("ghost", "Agent type ghost not found"),
                    child("w", 1),
                ],
            ),
            &[
                "wait",
                "spawned t/0.1 (w, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (started(key(1, 0), 1), &[]),
        (
            ok(key(1, 0), 1, "done"),
            &[
                "finished t/0.1 completed",
                "deliver 1.0 [- failed Agent type ghost not found; t/0.1 completed \"done\"]",
            ],
        ),
        (
            open(1, vec![refused("w", "limit max_agents reached")]),
            &["deliver 1.1 [- failed limit max_agents reached]"],
        ),
    ]);
}

#[test]
fn an_inline_child_is_delivered_with_its_history() {
    check(vec![
        (
            open_inline(admitted("helper", 1, FailurePolicy::Report, true)),
            &[
                "wait",
                "spawned t/0.1 (helper, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (
            ok(key(0, 0), 1, "merged"),
            &[
                "finished t/0.1 completed",
                "deliver inline 1.0 [t/0.1 completed \"merged\" +history]",
            ],
        ),
    ]);
}

/// A resumed tree's child that had finished before is merged as it was.
#[test]
fn a_recovered_child_is_reported_from_its_stored_result() {
    let table = check(vec![
        (
            open(0, vec![child("w", 1)]),
            &[
                "wait",
                "spawned t/0.1 (w, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (
            Input::Recovered {
                key: key(0, 0),
                result: result(AgentStatus::Completed, json!("stored"), 0.0),
            },
            &[
                "finished t/0.1 completed",
                "deliver 1.0 [t/0.1 completed \"stored\"]",
            ],
        ),
    ]);
    assert_eq!(table.outstanding(), 0);
}

// ---- cancel ----

/// Mirrors cancel.rs `a_child_cancelled_while_it_waits_for_a_live_slot_ends_cancelled_without_starting`.
#[test]
fn a_child_cancelled_while_it_waits_for_a_live_slot_ends_cancelled_without_starting() {
    let mut table = check(vec![
        (
            open(0, vec![child("worker", 1), child("worker", 2)]),
            &[
                "wait",
                "spawned t/0.1 (worker, attempt 0)",
                "spawned t/0.2 (worker, attempt 0)",
                "launch t/0.1, t/0.2 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (cancel("t/0.2"), &["skip t/0.2", "finished t/0.2 cancelled"]),
    ]);
    assert_eq!(
        table.outstanding(),
        2,
        "the second still counts as starting"
    );
    // Its launch task skips it and says so; that changes nothing else.
    assert!(table.handle(not_started(key(1, 0))).is_empty());
    assert_eq!(table.outstanding(), 1);
    let got: Vec<String> = table
        .handle(ok(key(0, 0), 1, "worked"))
        .iter()
        .map(show)
        .collect();
    assert_eq!(
        got,
        [
            "finished t/0.1 completed",
            "deliver 1.0 [t/0.1 completed \"worked\"; - cancelled Agent was cancelled]"
        ]
    );
    assert_eq!(table.outstanding(), 0);
}

/// Mirrors cancel.rs `cancelling_a_mid_tree_agent_cancels_its_subtree_only`
/// (the lead's view: mid is cancelled, an error entry; the sibling is fine).
#[test]
fn cancelling_a_mid_tree_agent_cancels_its_subtree_only() {
    check(vec![
        (
            open(
                0,
                vec![with_policy("mid", 1, retry(2, 10)), child("sib", 2)],
            ),
            &[
                "wait",
                "spawned t/0.1 (mid, attempt 0)",
                "spawned t/0.2 (sib, attempt 0)",
                "launch t/0.1, t/0.2 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (started(key(1, 0), 2), &[]),
        // A running child is cancelled directly (the supervisor casts to it;
        // through its parent it is the same).
        (cancel("t/0.1"), &["cancel actor 1: requested"]),
        // Cancelled is not failed: no retry.
        (cancelled(key(0, 0), 1), &["finished t/0.1 cancelled"]),
        (
            ok(key(1, 0), 2, "sibling done"),
            &[
                "finished t/0.2 completed",
                "deliver 1.0 [t/0.1 cancelled Agent was cancelled; t/0.2 completed \"sibling done\"]",
            ],
        ),
    ]);
}

/// Mirrors cancel.rs `cancelling_a_mid_tree_agent_cancels_its_subtree_only`
/// (mid's view: cancelled, it cancels its leaves; they stay on record).
#[test]
fn a_cancelled_parent_cancels_its_children_and_keeps_them_on_record() {
    let table = check(vec![
        (
            open(0, vec![child("leaf", 1), child("leaf", 2)]),
            &[
                "wait",
                "spawned t/0.1 (leaf, attempt 0)",
                "spawned t/0.2 (leaf, attempt 0)",
                "launch t/0.1, t/0.2 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (started(key(1, 0), 2), &[]),
        (
            parent_cancelled(CancelReason::Requested),
            &["cancel actor 1: requested", "cancel actor 2: requested"],
        ),
        (cancelled(key(1, 0), 2), &["finished t/0.2 cancelled"]),
        (cancelled(key(0, 0), 1), &["finished t/0.1 cancelled"]),
    ]);
    assert_eq!(table.outstanding(), 0);
    assert_eq!(
        late(&table),
        vec![(0, strings(&["t/0.1"])), (0, strings(&["t/0.2"]))]
    );
}

/// Mirrors cancel.rs `cancelling_the_tree_cancels_every_agent` (the root's
/// view: every child is told, none is delivered, all stay on record).
#[test]
fn cancelling_the_tree_cancels_every_agent() {
    let table = check(vec![
        (
            open(0, vec![child("mid", 1), child("sib", 2)]),
            &[
                "wait",
                "spawned t/0.1 (mid, attempt 0)",
                "spawned t/0.2 (sib, attempt 0)",
                "launch t/0.1, t/0.2 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (started(key(1, 0), 2), &[]),
        (
            parent_cancelled(CancelReason::Requested),
            &["cancel actor 1: requested", "cancel actor 2: requested"],
        ),
        (cancelled(key(0, 0), 1), &["finished t/0.1 cancelled"]),
        (cancelled(key(1, 0), 2), &["finished t/0.2 cancelled"]),
    ]);
    assert_eq!(table.outstanding(), 0);
    assert_eq!(
        late(&table),
        vec![(0, strings(&["t/0.1"])), (0, strings(&["t/0.2"]))]
    );
}

#[test]
fn a_tree_limit_reason_is_passed_to_the_children() {
    let limit = LimitHit::new(crate::limit::Limit::Deadline, "deadline passed");
    let shown = format!("cancel actor 1: limit {limit}");
    check(vec![
        (
            open(0, vec![child("w", 1)]),
            &[
                "wait",
                "spawned t/0.1 (w, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (
            parent_cancelled(CancelReason::Limit(limit)),
            &[shown.as_str()],
        ),
    ]);
}

#[test]
fn cancelling_an_unknown_or_reported_run_does_nothing() {
    check(vec![
        (
            open(0, vec![child("w", 1)]),
            &[
                "wait",
                "spawned t/0.1 (w, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (cancel("t/0.9"), &[]),
        (started(key(0, 0), 1), &[]),
        (
            ok(key(0, 0), 1, "done"),
            &[
                "finished t/0.1 completed",
                "deliver 1.0 [t/0.1 completed \"done\"]",
            ],
        ),
        (cancel("t/0.1"), &[]),
    ]);
}

// ---- races ----

/// Part of cancel.rs `no_actor_outlives_wait_on_a_multi_thread_runtime`: a
/// child that ends before its start is seen is reported once, and its late
/// start changes nothing.
#[test]
fn a_child_that_ended_before_its_start_was_seen() {
    let mut table = check(vec![
        (
            open(0, vec![child("w", 1)]),
            &[
                "wait",
                "spawned t/0.1 (w, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (
            ok(key(0, 0), 1, "quick"),
            &[
                "finished t/0.1 completed",
                "deliver 1.0 [t/0.1 completed \"quick\"]",
            ],
        ),
    ]);
    assert_eq!(table.outstanding(), 1, "its start is still to come");
    assert!(table.handle(started(key(0, 0), 1)).is_empty());
    assert_eq!(table.outstanding(), 0);
    assert!(!table.is_live(&1));
}

/// Part of cancel.rs `no_actor_outlives_wait_on_a_multi_thread_runtime`: a
/// child lost before its start is seen is reported when the start comes.
#[test]
fn a_child_lost_before_its_start_was_seen() {
    let table = check(vec![
        (
            open(0, vec![child("w", 1)]),
            &[
                "wait",
                "spawned t/0.1 (w, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (lost(1, "agent was killed (boom)"), &[]),
        (
            started(key(0, 0), 1),
            &[
                "finished t/0.1 failed",
                "deliver 1.0 [t/0.1 failed agent was killed (boom)]",
            ],
        ),
    ]);
    assert_eq!(table.outstanding(), 0);
    assert_eq!(table.live_count(), 0);
}

/// Part of cancel.rs `no_actor_outlives_wait_on_a_multi_thread_runtime`: the
/// parent ends while children start; one that starts afterwards is cancelled
/// at once, one its launch task skips ends failed, and the parent waits for both.
#[test]
fn a_child_that_starts_after_its_parent_ended_is_cancelled_at_once() {
    let mut table = check(vec![
        (
            open(0, vec![child("x", 1), child("y", 2)]),
            &[
                "wait",
                "spawned t/0.1 (x, attempt 0)",
                "spawned t/0.2 (y, attempt 0)",
                "launch t/0.1, t/0.2 at depth 1",
            ],
        ),
        (parent_cancelled(CancelReason::Requested), &[]),
        (started(key(0, 0), 1), &["cancel actor 1: requested"]),
    ]);
    assert_eq!(table.outstanding(), 2);
    let got: Vec<String> = table
        .handle(not_started(key(1, 0)))
        .iter()
        .map(show)
        .collect();
    assert_eq!(got, ["finished t/0.2 failed"]);
    let got: Vec<String> = table
        .handle(cancelled(key(0, 0), 1))
        .iter()
        .map(show)
        .collect();
    assert_eq!(got, ["finished t/0.1 cancelled"]);
    assert_eq!(table.outstanding(), 0);
    assert_eq!(late(&table), vec![(0, strings(&["t/0.1"])), (0, vec![])]);
}

#[test]
fn results_after_the_parent_ended_are_recorded_not_delivered_nor_retried() {
    let table = check(vec![
        (
            open(0, vec![child("a", 1), with_policy("b", 2, retry(3, 10))]),
            &[
                "wait",
                "spawned t/0.1 (a, attempt 0)",
                "spawned t/0.2 (b, attempt 0)",
                "launch t/0.1, t/0.2 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (started(key(1, 0), 2), &[]),
        (ok(key(0, 0), 1, "a"), &["finished t/0.1 completed"]),
        (parent_ended(), &["cancel actor 2: parent ended"]),
        (failed(key(1, 0), 2, "broke"), &["finished t/0.2 failed"]),
    ]);
    assert_eq!(table.outstanding(), 0);
    assert_eq!(
        late(&table),
        vec![(0, strings(&["t/0.1"])), (0, strings(&["t/0.2"]))]
    );
}

#[test]
fn a_retry_still_waiting_when_the_parent_ends_is_stopped_and_stays_failed() {
    let table = check(vec![
        (
            open(0, vec![with_policy("w", 1, retry(3, 10))]),
            &[
                "wait",
                "spawned t/0.1 (w, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (
            failed(key(0, 0), 1, "down"),
            &[
                "finished t/0.1 failed",
                "retrying t/0.1 as attempt 1 in 10ms: down",
                "retry 1.0.0#1 in 10ms",
            ],
        ),
        (
            parent_cancelled(CancelReason::Requested),
            &["stop retry 1.0.0#1"],
        ),
        // A timer that fired anyway starts nothing.
        (due(key(0, 1)), &[]),
    ]);
    assert_eq!(table.outstanding(), 0);
    assert_eq!(late(&table), vec![(0, strings(&["t/0.1"]))]);
}

#[test]
fn results_of_a_stale_attempt_are_ignored() {
    check(vec![
        (
            open(0, vec![with_policy("w", 1, retry(1, 10))]),
            &[
                "wait",
                "spawned t/0.1 (w, attempt 0)",
                "launch t/0.1 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (
            lost(1, "agent panicked: boom"),
            &[
                "finished t/0.1 failed",
                "retrying t/0.1 as attempt 1 in 10ms: agent panicked: boom",
                "retry 1.0.0#1 in 10ms",
            ],
        ),
        (
            due(key(0, 1)),
            &[
                "spawned t/0.1~1 (w, attempt 1)",
                "launch t/0.1~1 at depth 1",
            ],
        ),
        (started(key(0, 1), 2), &[]),
        // Attempt 0 again (defensive: the table keys results by attempt).
        (ok(key(0, 0), 9, "stale"), &[]),
        (
            ok(key(0, 1), 2, "fresh"),
            &[
                "finished t/0.1~1 completed",
                "deliver 1.0 [t/0.1,t/0.1~1 completed \"fresh\"]",
            ],
        ),
        // A second result of a child that has reported.
        (ok(key(0, 1), 2, "again"), &[]),
    ]);
}

/// Mirrors failure.rs `the_children_of_every_attempt_have_their_own_run_ids`:
/// each attempt starts with its own run id (same agent id), from which its
/// own children's ids derive.
#[test]
fn the_children_of_every_attempt_have_their_own_run_ids() {
    let mut table = Table::default();
    let mut starts = Vec::new();
    let mut take = |outputs: Vec<Output<u32>>| {
        for output in outputs {
            if let Output::Launch(launch) = output {
                let parent = &launch.parent.run_id;
                starts.extend(launch.children.iter().map(|s| (s.key, s.ids(parent))));
            }
        }
    };
    take(table.handle(open(0, vec![with_policy("mid", 1, retry(1, 10))])));
    take(table.handle(started(key(0, 0), 1)));
    take(table.handle(failed(key(0, 0), 1, "mid broke")));
    take(table.handle(due(key(0, 1))));
    assert_eq!(
        starts,
        [
            (
                key(0, 0),
                RunIds {
                    agent_id: "t/0.1".parse().unwrap(),
                    run_id: "t/0.1".parse().unwrap()
                }
            ),
            (
                key(0, 1),
                RunIds {
                    agent_id: "t/0.1".parse().unwrap(),
                    run_id: "t/0.1~1".parse().unwrap()
                }
            ),
        ]
    );
}

/// Part of cancel.rs `status_is_served_while_a_model_call_is_pending`: the
/// parent's status counts the children that run.
#[test]
fn live_children_are_those_whose_start_was_seen() {
    let mut table = check(vec![(
        open(0, vec![child("w", 1), child("w", 2)]),
        &[
            "wait",
            "spawned t/0.1 (w, attempt 0)",
            "spawned t/0.2 (w, attempt 0)",
            "launch t/0.1, t/0.2 at depth 1",
        ],
    )]);
    assert_eq!((table.live_count(), table.outstanding()), (0, 2));
    table.handle(started(key(0, 0), 1));
    assert_eq!((table.live_count(), table.outstanding()), (1, 2));
    assert!(table.is_live(&1));
}

/// Mirrors failure.rs `child_run_ids_keep_request_order_when_a_step_is_cut_short`:
/// the second call is delivered, the first is cut short by an escalation; its
/// children are left for the machine to record in call order.
#[test]
fn child_run_ids_keep_request_order_when_a_step_is_cut_short() {
    let table = check(vec![
        (
            open(
                0,
                vec![
                    with_policy("bad", 1, FailurePolicy::Escalate),
                    child("worker", 2),
                ],
            ),
            &[
                "wait",
                "spawned t/0.1 (bad, attempt 0)",
                "spawned t/0.2 (worker, attempt 0)",
                "launch t/0.1, t/0.2 at depth 1",
            ],
        ),
        (
            open(1, vec![child("worker", 3)]),
            &[
                "wait",
                "spawned t/0.3 (worker, attempt 0)",
                "launch t/0.3 at depth 1",
            ],
        ),
        (started(key_in(0, 0, 0), 1), &[]),
        (started(key_in(0, 1, 0), 2), &[]),
        (started(key_in(1, 0, 0), 3), &[]),
        (
            ok(key_in(1, 0, 0), 3, "fast done"),
            &[
                "finished t/0.3 completed",
                "deliver 1.1 [t/0.3 completed \"fast done\"]",
            ],
        ),
        (
            failed(key_in(0, 0, 0), 1, "broke"),
            &[
                "finished t/0.1 failed",
                "fail: child bad (t/0.1) failed: broke",
            ],
        ),
        (parent_ended(), &["cancel actor 2: parent ended"]),
        (cancelled(key_in(0, 1, 0), 2), &["finished t/0.2 cancelled"]),
    ]);
    assert_eq!(table.outstanding(), 0);
    assert_eq!(
        late(&table),
        vec![(0, strings(&["t/0.1"])), (0, strings(&["t/0.2"]))]
    );
}

// ---- background calls (semantics §15) ----

fn open_background(call: usize, children: Vec<Admission>) -> Input<u32> {
    Input::Open {
        step: STEP,
        call,
        inline: false,
        background: true,
        parent: parent(),
        children,
        planner: None,
    }
}

#[test]
fn a_background_call_never_makes_the_parent_wait_and_hands_over_each_report_once() {
    let mut table = check(vec![
        (
            open_background(0, vec![child("a", 1), refused("x", "nope"), child("b", 2)]),
            &[
                "spawned t/0.1 (a, attempt 0)",
                "spawned t/0.2 (b, attempt 0)",
                "launch t/0.1, t/0.2 at depth 1",
            ],
        ),
        (started(key(0, 0), 1), &[]),
        (started(key(2, 0), 2), &[]),
        (
            ok(key(2, 0), 2, "B"),
            &["finished t/0.2 completed", "report t/0.2 completed"],
        ),
    ]);
    // The parent waits for none of them; one is still out.
    assert_eq!(table.awaited(), 0);
    assert_eq!(table.outstanding(), 1);
    // The refused one and the delivered one are not late.
    assert_eq!(late(&table), [(0, strings(&[]))]);
    let out: Vec<String> = table
        .handle(ok(key(0, 0), 1, "A"))
        .iter()
        .map(show)
        .collect();
    assert_eq!(out, ["finished t/0.1 completed", "report t/0.1 completed"]);
    assert!(late(&table).is_empty());
    // A late duplicate of an ended child is not handed over again.
    let out: Vec<String> = table
        .handle(ok(key(0, 0), 1, "A"))
        .iter()
        .map(show)
        .collect();
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn a_background_child_still_out_when_the_parent_ends_is_cancelled_and_left_late() {
    let table = check(vec![
        (
            open_background(0, vec![child("a", 1)]),
            &["spawned t/0.1 (a, attempt 0)", "launch t/0.1 at depth 1"],
        ),
        (started(key(0, 0), 1), &[]),
        (parent_ended(), &["cancel actor 1: parent ended"]),
        (cancelled(key(0, 0), 1), &["finished t/0.1 cancelled"]),
    ]);
    assert_eq!(late(&table), [(0, strings(&["t/0.1"]))]);
}

/// The call's count of children still to report (kept, not recounted per
/// report: a call of 10,000 children walked all of them on every report)
/// follows every way a child gets its report: it ends, it is cancelled
/// before it starts, it fails and is retried, or it was refused.
#[test]
fn a_wide_call_counts_its_children_down_and_is_delivered_once_after_the_last() {
    const WIDE: usize = 300;
    let mut table = Table::default();
    let children: Vec<Admission> = (0..WIDE)
        .map(|i| match i % 10 {
            9 => refused("x", "over the limit"),
            3 => with_policy("r", i as u32 + 1, retry(1, 5)),
            _ => child("a", i as u32 + 1),
        })
        .collect();
    let refused_count = WIDE / 10;
    table.handle(open(0, children));
    assert_eq!(table.awaited(), WIDE - refused_count);
    let mut delivered = 0;
    let mut reported = 0;
    for i in (0..WIDE).filter(|i| i % 10 != 9) {
        let actor = i as u32;
        let mut out = Vec::new();
        if i % 10 == 5 {
            // Cancelled while it waits for its slot: it reports now, and its
            // launch then says it never started (which changes nothing).
            out.extend(table.handle(cancel(&format!("t/0.{}", i + 1))));
            // (It makes room in the call's window: the next child comes up.)
            let after = table.handle(not_started(key(i, 0)));
            assert!(
                after.iter().all(|o| matches!(
                    o,
                    Output::More { .. } | Output::Emit(EventKind::ChildSpawned { .. })
                )),
                "{after:?}"
            );
        } else {
            table.handle(started(key(i, 0), actor));
            if i % 10 == 3 {
                // The first attempt fails: the child is still to report.
                table.handle(failed(key(i, 0), actor, "boom"));
                assert_eq!(table.awaited(), WIDE - refused_count - reported);
                table.handle(due(key(i, 1)));
                table.handle(started(key(i, 1), actor + 10_000));
                out.extend(table.handle(ok(key(i, 1), actor + 10_000, "ok")));
            } else {
                out.extend(table.handle(ok(key(i, 0), actor, "ok")));
            }
        }
        reported += 1;
        assert_eq!(table.awaited(), WIDE - refused_count - reported);
        delivered += out
            .iter()
            .filter(|o| matches!(o, Output::Deliver(d) if d.reports.len() == WIDE))
            .count();
        let last = reported == WIDE - refused_count;
        assert_eq!(delivered, usize::from(last), "delivered after child {i}");
    }
    assert_eq!(table.outstanding(), 0);
    assert!(table.undelivered().is_empty());
}

/// The attempts the outputs launch, in order.
fn starts(outputs: Vec<Output<u32>>) -> Vec<Start> {
    launched(outputs)
        .into_iter()
        .map(|(start, _)| start)
        .collect()
}

/// The attempts the outputs launch, in order, each with its ids.
fn launched(outputs: Vec<Output<u32>>) -> Vec<(Start, RunIds)> {
    outputs
        .into_iter()
        .filter_map(|output| match output {
            Output::Launch(launch) => Some(
                launch
                    .children
                    .into_iter()
                    .map(|s| {
                        let ids = s.ids(&launch.parent.run_id);
                        (s, ids)
                    })
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        })
        .flatten()
        .collect()
}

/// A launch holds its children's plans by pointer, the slot's own: a wide
/// call's children waiting for live slots are not a second copy of every
/// prompt and params (issue 17). The slot lets go of it with the report.
#[test]
fn a_launch_shares_its_childrens_plans_with_their_slots() {
    let mut table = Table::default();
    let outputs = table.handle(open(0, vec![child("a", 1), child("b", 2)]));
    let plans: Vec<Arc<ChildPlan>> = starts(outputs).into_iter().map(|s| s.plan).collect();
    assert_eq!(plans.len(), 2);
    for plan in &plans {
        assert_eq!(Arc::strong_count(plan), 2, "the launch's and the slot's");
    }
    table.handle(started(key(0, 0), 1));
    table.handle(ok(key(0, 0), 1, "done"));
    assert_eq!(
        Arc::strong_count(&plans[0]),
        1,
        "the reported child's slot let go"
    );
    assert_eq!(Arc::strong_count(&plans[1]), 2);
}

/// An agent id read back from a store may end in an attempt of its own
/// (`~n`): its attempts still run as `id.retry(n)`, and a cancel by such a
/// run id still finds the child (as when the slot kept the id as text).
#[test]
fn a_child_whose_stored_agent_id_ends_in_an_attempt_is_cancelled_by_its_run_id() {
    let mut table = Table::default();
    let Admission::Admitted { plan, toolbox, .. } = child("a", 1) else {
        unreachable!("child() admits")
    };
    let id: RunId = "t/0.1~2".parse().unwrap();
    let outputs = table.handle(open(0, vec![Admission::Admitted { plan, toolbox, id }]));
    let ids: Vec<RunIds> = launched(outputs).into_iter().map(|(_, ids)| ids).collect();
    assert_eq!(
        ids,
        [RunIds {
            agent_id: "t/0.1~2".parse().unwrap(),
            run_id: "t/0.1".parse().unwrap()
        }]
    );
    let outputs = table.handle(cancel("t/0.1"));
    assert!(
        outputs
            .iter()
            .any(|o| matches!(o, Output::Skip { run_id } if run_id == "t/0.1")),
        "{:?}",
        outputs.iter().map(show).collect::<Vec<_>>()
    );
}

/// A child waiting for its live slot is its `Start` in the launch, its slot
/// and its plan: the 10^8-agent tree holds ~10^7 at once (issue 34). None
/// holds its run ids as text (made when it starts) or a copy of what its
/// call's children share. Before, a `Start` carried two id strings (152 bytes
/// with their text) and a plan 224 bytes plus its prompt's spare room.
#[test]
fn a_child_waiting_for_its_slot_is_a_few_dozen_bytes_not_a_kilobyte() {
    use std::mem::size_of;
    assert!(
        size_of::<Start>() <= 64,
        "Start is {} bytes",
        size_of::<Start>()
    );
    assert!(
        size_of::<Slot>() <= 104,
        "Slot is {} bytes",
        size_of::<Slot>()
    );
    assert!(
        size_of::<ChildPlan>() <= 80,
        "ChildPlan is {} bytes",
        size_of::<ChildPlan>()
    );
    // The ids come from the parent's run id and the child's ordinal.
    let outputs = Table::default().handle(open(0, vec![child("a", 7)]));
    let launched = launched(outputs);
    assert_eq!(launched[0].1.run_id, "t/0.7");
    assert!(matches!(launched[0].0.id, ChildId::Of(7)));
}

// ---- a wide call's waiting children (issue 34, item 7) ----

/// A `spawn_agents` call of `n` children of type `leaf` (prompts `part I`),
/// planned as the step machine plans it and admitted with ordinals 1..=n.
fn open_planned(n: usize) -> Input<u32> {
    let agents: Vec<Value> = (0..n)
        .map(|i| json!({"agent_type": "leaf", "prompt": format!("part {i}")}))
        .collect();
    let call = crate::message::ToolCall {
        tool_call_id: "c".into(),
        tool_name: "spawn_agents".into(),
        input: json!({ "agents": agents }).into(),
    };
    let message = Arc::new(Message::assistant(None, vec![call]));
    let parent_template = AgentTemplate::new("p", "m").spawns(&["leaf"]);
    let leaf = Arc::new(AgentTemplate::new("leaf", "m"));
    let planned = SpawnPlan::check(
        &parent_template,
        (message, 0),
        "spawn_agents",
        &Arc::new(History::new()),
        &crate::spawn::Notices::default(),
        |id| (id == "leaf").then(|| leaf.clone()),
        |id| id == "leaf",
    );
    let children = planned
        .children
        .iter()
        .enumerate()
        .map(|(i, c)| match c {
            Ok(kind) => Admission::Waiting {
                kind: *kind,
                ordinal: i as u32 + 1,
            },
            Err(r) => refused(&r.0, &r.1),
        })
        .collect();
    Input::Open {
        step: STEP,
        call: 0,
        inline: false,
        background: false,
        parent: parent(),
        children,
        planner: Some(Planner {
            plan: planned.plan,
            toolboxes: vec![Some(toolbox())],
        }),
    }
}

fn spawned(outputs: &[Output<u32>]) -> Vec<RunId> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Emit(EventKind::ChildSpawned { child_run_id, .. }) => {
                Some(child_run_id.clone())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_wide_calls_children_wait_as_numbers_and_come_up_as_earlier_ones_start() {
    // A waiting child is its kind and ordinal: 8 bytes in a 16-byte entry.
    assert!(std::mem::size_of::<Entry>() <= 16);
    let n = LAUNCH_WINDOW + 2;
    let mut table = Table::default();
    let out = table.handle(open_planned(n));
    // The window's children are announced and launched; the launch waits in
    // line for all of them.
    assert_eq!(spawned(&out).len(), LAUNCH_WINDOW);
    assert_eq!(spawned(&out)[0], "t/0.1");
    assert_eq!(
        show(out.last().unwrap()).split(" at ").nth(1),
        Some(format!("depth 1, {n} in all").as_str())
    );
    let Some(Output::Launch(launch)) = out.last() else {
        panic!("no launch: {out:?}")
    };
    assert_eq!(launch.children[1].plan.prompt.as_deref(), Some("part 1"));
    assert_eq!(table.awaited(), n);
    // One starts: the next comes up, made from its entry in the call.
    let out = table.handle(started(key(0, 0), 100));
    assert_eq!(
        out.iter().map(show).collect::<Vec<_>>(),
        [
            format!("spawned t/0.{} (leaf, attempt 0)", LAUNCH_WINDOW + 1),
            format!("more for 1.0: 1.0.{LAUNCH_WINDOW}#0"),
        ]
    );
    let Some(Output::More { children, .. }) = out.last() else {
        unreachable!()
    };
    assert_eq!(
        children[0].plan.prompt.as_deref(),
        Some(format!("part {LAUNCH_WINDOW}").as_str())
    );
    // One that could not start makes room too; the last one says so.
    let out = table.handle(not_started(key(1, 0)));
    assert_eq!(
        out.iter().map(show).collect::<Vec<_>>(),
        [
            "finished t/0.2 failed".to_owned(),
            format!("spawned t/0.{} (leaf, attempt 0)", LAUNCH_WINDOW + 2),
            format!("more for 1.0: 1.0.{}#0, the last", LAUNCH_WINDOW + 1),
        ]
    );
    // Every child reports, in request order, once all have.
    let mut delivered = None;
    for child in 0..n {
        let mut outputs = Vec::new();
        if child != 1 {
            if child != 0 {
                outputs.extend(table.handle(started(key(child, 0), child as u32 + 100)));
            }
            outputs.extend(table.handle(ok(key(child, 0), child as u32 + 100, "done")));
        }
        assert!(
            !outputs.iter().any(|o| matches!(o, Output::More { .. })),
            "nothing is left to launch"
        );
        delivered = outputs.into_iter().find_map(|o| match o {
            Output::Deliver(d) => Some(d),
            _ => None,
        });
    }
    let delivered = delivered.expect("the call is delivered when the last reports");
    assert_eq!(delivered.reports.len(), n);
    assert_eq!(delivered.reports[0].run_ids, ["t/0.1"]);
    assert_eq!(delivered.reports[n - 1].run_ids, [format!("t/0.{n}")]);
    assert_eq!(delivered.reports[1].status, AgentStatus::Failed);
    assert_eq!(table.awaited(), 0);
}

#[test]
fn a_wide_call_whose_parent_ended_launches_no_more_and_its_unannounced_children_are_unknown() {
    let n = LAUNCH_WINDOW + 5;
    let mut table = Table::default();
    table.handle(open_planned(n));
    // A child still waiting as a number was never announced: no one can
    // name it to cancel it.
    assert!(table.handle(cancel(&format!("t/0.{n}"))).is_empty());
    let out = table.handle(parent_cancelled(CancelReason::Requested));
    assert!(spawned(&out).is_empty());
    // Starts after the end launch nothing more.
    let out = table.handle(started(key(0, 0), 7));
    assert_eq!(
        out.iter().map(show).collect::<Vec<_>>(),
        ["cancel actor 7: requested"]
    );
    let out = table.handle(not_started(key(1, 0)));
    assert!(
        !out.iter()
            .any(|o| matches!(o, Output::More { .. } | Output::Launch(_))),
        "{out:?}"
    );
    // Only the launched ones are the call's to record, and only the one
    // that ran has a run id: the waiting ones never were runs.
    assert_eq!(late(&table).len(), LAUNCH_WINDOW);
    table.handle(cancelled(key(0, 0), 7));
    let runs: Vec<String> = late(&table).into_iter().flat_map(|(_, r)| r).collect();
    assert_eq!(runs, ["t/0.1"]);
}

/// The review of issue 34's change: a retry inside a call that still has
/// children waiting takes no place in the call's window, and an escalated
/// failure launches nothing more.
#[test]
fn a_retry_in_a_wide_call_takes_no_window_place_and_an_escalation_launches_nothing_more() {
    let n = LAUNCH_WINDOW + 3;
    let mut table = Table::default();
    table.handle(open_planned(n));
    // Child 0 starts (child 64 comes up) and fails: `report` policy, so it
    // is reported; no retry is asked, and the window does not grow.
    let out = table.handle(started(key(0, 0), 1));
    assert_eq!(spawned(&out), [format!("t/0.{}", LAUNCH_WINDOW + 1)]);
    let out = table.handle(failed(key(0, 0), 1, "boom"));
    assert!(spawned(&out).is_empty(), "{out:?}");
    // Every other launched child starts: each brings up one more, until
    // the last, which says no more follow.
    let mut more = 0;
    let mut last = false;
    for child in 1..=LAUNCH_WINDOW {
        for o in table.handle(started(key(child, 0), child as u32 + 1)) {
            if let Output::More {
                children, last: l, ..
            } = o
            {
                more += children.len();
                last |= l;
            }
        }
    }
    assert_eq!(more, 2);
    assert!(last);
}

#[test]
fn a_planned_calls_children_are_numbered_in_order_and_a_broken_kind_is_refused_uncounted() {
    use crate::supervision::admit::{Tree, admit_planned};
    struct Canned(Vec<String>);
    impl Tree for Canned {
        fn toolbox(
            &mut self,
            template: &AgentTemplate,
        ) -> Result<Arc<Toolbox>, crate::toolbox::ToolboxError> {
            if template.id == "broken" {
                return Err(crate::toolbox::ToolboxError::Unresolved {
                    entry: "x".into(),
                    reason: "tool x is not configured".into(),
                });
            }
            Ok(toolbox())
        }
        fn count(&mut self, id: &RunId, _index: usize) -> Result<(), crate::limit::LimitHit> {
            self.0.push(id.to_string());
            Ok(())
        }
    }
    let agents = json!({"agents": [
        {"agent_type": "leaf", "prompt": "a"},
        {"agent_type": "broken"},
        {"agent_type": "ghost"},
        {"agent_type": "leaf", "prompt": "b"},
    ]});
    let call = crate::message::ToolCall {
        tool_call_id: "c".into(),
        tool_name: "spawn_agents".into(),
        input: agents.into(),
    };
    let message = Arc::new(Message::assistant(None, vec![call]));
    let parent_template = AgentTemplate::new("p", "m").spawns(&["leaf", "broken"]);
    let templates = |id: &str| match id {
        "leaf" | "broken" => Some(Arc::new(AgentTemplate::new(id, "m"))),
        _ => None,
    };
    let planned = SpawnPlan::check(
        &parent_template,
        (message, 0),
        "spawn_agents",
        &Arc::new(History::new()),
        &crate::spawn::Notices::default(),
        templates,
        |id| templates(id).is_some(),
    );
    let parent: RunId = "t/0".parse().unwrap();
    let mut tree = Canned(Vec::new());
    let (admissions, planner, admitted) = admit_planned(planned, &parent, 3, &mut tree);
    let shown: Vec<String> = admissions
        .iter()
        .map(|a| match a {
            Admission::Waiting { kind, ordinal } => format!("kind {kind} as {ordinal}"),
            Admission::Refused { agent_type, error } => format!("{agent_type}: {error}"),
            Admission::Admitted { id, .. } => id.to_string(),
        })
        .collect();
    assert_eq!(
        shown,
        [
            "kind 0 as 3",
            "broken: tool x is not configured",
            "ghost: Agent type ghost not found",
            "kind 0 as 4",
        ]
    );
    assert_eq!(admitted, 2);
    assert_eq!(tree.0, ["t/0.3", "t/0.4"]);
    // The refused kind has no toolbox to start with; the admitted one's
    // plan is made from its entry.
    assert!(planner.toolboxes[1].is_none());
    let plan = planner.plan.child(3, 0).unwrap();
    assert_eq!(plan.prompt.as_deref(), Some("b"));
}

//! The idle watchdog (semantics §11, `idle_timeout`): an agent whose own work
//! in flight makes no progress for its timeout emits `stalled` and fails; one
//! that waits for its children, or whose model streams steadily, does not.

use std::sync::Arc;
use std::time::Duration;

use arbor_actors::models::scripted::ScriptedModel;
use arbor_actors::{
    AgentStatus, Delta, DeltaSink, Event, EventKind, FailureKind, Model, ModelError, ModelRequest,
    ModelResponse, Tool, ToolContext, ToolError, ToolOutput,
};
use arbor_supervisor::TreeLimits;
use async_trait::async_trait;
use serde_json::{Value, json};

use crate::common::*;

/// A tool whose call never returns.
struct Hang;

#[async_trait]
impl Tool for Hang {
    fn name(&self) -> &str {
        "hang"
    }
    fn description(&self) -> &str {
        "Never answers."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(&self, _input: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        std::future::pending().await
    }
}

/// The scripted model, but each call first streams `deltas` text deltas,
/// one every `every` (virtual time).
struct Trickle {
    inner: Arc<ScriptedModel>,
    every: Duration,
    deltas: u32,
}

#[async_trait]
impl Model for Trickle {
    fn name(&self) -> &str {
        "trickle"
    }

    async fn complete(
        &self,
        request: ModelRequest,
        sink: DeltaSink,
    ) -> Result<ModelResponse, ModelError> {
        for _ in 0..self.deltas {
            tokio::time::sleep(self.every).await;
            sink(Delta::Text { text: "…".into() });
        }
        self.inner.complete(request, sink).await
    }
}

fn stalls(events: &[Arc<Event>]) -> Vec<(RunId, u32, u64)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Stalled { step, idle_ms } => Some((e.run_id.clone(), *step, *idle_ms)),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_tool_that_never_returns_stalls_its_agent_while_its_sibling_and_parent_go_on() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("stuck", "wait forever"), ("fine", "answer")])]},
            {"text": "lead done"}
        ]},
        {"agent": "stuck", "steps": [{"toolCalls": [call("hang", json!({}))]}]},
        {"agent": "fine", "steps": [
            {"toolCalls": [call("echo", json!({"n": 1}))]},
            {"text": "fine done", "delayMs": 100}
        ]}
    ]}));
    let timeout = Duration::from_secs(2);
    let mut stuck = template("stuck");
    stuck.tools.push("hang".into());
    stuck.idle_timeout = Some(timeout);
    let mut fine = with_echo(template("fine"));
    fine.idle_timeout = Some(timeout);
    // The lead waits for its children longer than its own idle_timeout:
    // waiting for children is no work of its own, so it does not stall.
    let mut lead = template("lead").spawns(&["stuck", "fine"]);
    lead.idle_timeout = Some(Duration::from_millis(500));
    let sup = supervisor_with(
        &model,
        vec![lead, stuck, fine],
        Vec::new(),
        vec![echo(), Arc::new(Hang)],
        TreeLimits::default(),
    );
    let started = tokio::time::Instant::now();
    let (result, events) = run(&sup, "lead", "go").await;
    let took = started.elapsed();
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(1),
        "{took:?}"
    );

    assert_eq!(result.state.status, AgentStatus::Completed);
    let stuck_run = &result.state.child_run_ids[0];
    let fine_run = &result.state.child_run_ids[1];
    // One stall, of the stuck child, at its step 1, after the whole timeout.
    assert_eq!(
        stalls(&events),
        [(stuck_run.clone(), 1, 2000)],
        "{events:#?}"
    );
    let stalled_at = events
        .iter()
        .position(|e| matches!(e.kind, EventKind::Stalled { .. }))
        .unwrap();
    let failed_at = events
        .iter()
        .position(|e| matches!(e.kind, EventKind::AgentFailed { .. }) && e.run_id == *stuck_run)
        .expect("the stuck child fails");
    assert!(stalled_at < failed_at);

    let stuck = sup.finished_state(stuck_run).unwrap();
    assert_eq!(stuck.status, AgentStatus::Failed);
    assert_eq!(stuck.error_kind, Some(FailureKind::Stalled));
    let error = stuck.error_message().unwrap();
    assert!(
        error.contains("idle_timeout") && error.contains("2s"),
        "{error}"
    );
    // The parent's failure policy (report) gives it the error entry.
    let entries = tool_result(&result.state, "spawn_agents");
    let entry = error_of(&entries[0]).expect("an error entry");
    assert!(entry.contains("idle_timeout"), "{entry}");
    assert_eq!(last_text(&entries[1]["value"]), "fine done");
    let fine = sup.finished_state(fine_run).unwrap();
    assert_eq!(fine.status, AgentStatus::Completed);
    assert_eq!(sup.live_actors(), 0);
}

fn trickling(every: Duration, deltas: u32, idle_timeout: Duration) -> arbor_supervisor::Supervisor {
    let model = scripted(json!({"replies": [
        {"agent": "talker", "steps": [{"text": "said it all"}]}
    ]}));
    let trickle = Arc::new(Trickle {
        inner: model.clone(),
        every,
        deltas,
    });
    let mut talker = arbor_actors::AgentTemplate::new("talker", "trickle");
    talker.idle_timeout = Some(idle_timeout);
    supervisor_with(
        &model,
        vec![talker],
        vec![("trickle", trickle as Arc<dyn Model>)],
        Vec::new(),
        TreeLimits::default(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_model_that_streams_slowly_but_steadily_is_not_stalled() {
    // A delta a second for 10 s, against a 3 s idle_timeout.
    let sup = trickling(Duration::from_secs(1), 10, Duration::from_secs(3));
    let started = tokio::time::Instant::now();
    let (result, events) = run(&sup, "talker", "talk").await;
    assert!(started.elapsed() >= Duration::from_secs(10));
    assert_eq!(result.state.status, AgentStatus::Completed, "{events:#?}");
    assert_eq!(stalls(&events), []);
    let deltas = events
        .iter()
        .filter(|e| {
            matches!(&e.kind, EventKind::ModelDelta { delta: Delta::Text { text }, .. } if text == "…")
        })
        .count();
    assert_eq!(deltas, 10);
}

#[tokio::test(start_paused = true)]
async fn a_model_whose_stream_pauses_longer_than_the_timeout_is_stalled() {
    // The same stream, a delta every 4 s: the first gap is already too long.
    let sup = trickling(Duration::from_secs(4), 10, Duration::from_secs(3));
    let started = tokio::time::Instant::now();
    let (result, events) = run(&sup, "talker", "talk").await;
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!(result.state.status, AgentStatus::Failed);
    assert_eq!(result.state.error_kind, Some(FailureKind::Stalled));
    assert_eq!(stalls(&events).len(), 1);
    assert_eq!(stalls(&events)[0].2, 3000);
}

/// A person's messages are not the agent's progress: steering a run whose
/// tool hangs does not keep its idle watchdog from stalling it.
#[tokio::test(start_paused = true)]
async fn steering_a_run_whose_tool_hangs_does_not_keep_it_from_stalling() {
    let model = scripted(json!({"replies": [
        {"agent": "stuck", "steps": [{"toolCalls": [call("hang", json!({}))]}]}
    ]}));
    let mut stuck = template("stuck");
    stuck.tools.push("hang".into());
    stuck.idle_timeout = Some(Duration::from_secs(2));
    let sup = supervisor_with(
        &model,
        vec![stuck],
        Vec::new(),
        vec![Arc::new(Hang)],
        TreeLimits::default(),
    );
    let started = tokio::time::Instant::now();
    let handle = start(&sup, "stuck", "go").await;
    let root = handle.root_run_id.clone();
    // A message every half second, until the run refuses them (it ended).
    let mut accepted = 0;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if sup.steer(&root, "are you there?").await.is_err() {
            break;
        }
        accepted += 1;
    }
    let ended = started.elapsed();
    let result = finish(handle).await;
    assert!(accepted >= 3, "{accepted} steers accepted");
    assert_eq!(result.state.status, AgentStatus::Failed);
    assert_eq!(result.state.error_kind, Some(FailureKind::Stalled));
    assert!(ended < Duration::from_secs(3), "still running at {ended:?}");
}

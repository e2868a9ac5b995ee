//! Steering a running agent (semantics §9): the message joins its history at
//! the next step boundary, is journaled, and survives a restart and a replay.

use std::sync::Arc;

use arbor_actors::steer::{STEERING, SteerLimits, SteerRefused};
use arbor_actors::{
    AgentStatus, DeltaSink, EventKind, Model, ModelError, ModelRequest, ModelResponse, Tool,
};
use arbor_supervisor::store::{SqliteStore, Store};
use arbor_supervisor::{Catalog, Error, Supervisor, TreeLimits};
use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::common::*;

/// A boss that looks twice (an `echo` call each step), then answers.
fn script() -> Value {
    json!({"replies": [{"agent": "boss", "steps": [
        {"text": "Looking.", "toolCalls": [{"name": "echo", "input": {"n": 1}}]},
        {"text": "Still looking.", "toolCalls": [{"name": "echo", "input": {"n": 2}}]},
        {"text": "Done."}
    ]}]})
}

/// The scripted model, but step 2 answers only once the test opens the gate,
/// so a steer reliably arrives while that step is in flight.
struct Gated {
    inner: Arc<dyn Model>,
    gate: Arc<Semaphore>,
}

#[async_trait]
impl Model for Gated {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn complete(
        &self,
        request: ModelRequest,
        deltas: DeltaSink,
    ) -> Result<ModelResponse, ModelError> {
        if request.meta.step == 2 {
            let _ = self.gate.acquire().await.map(|p| p.forget());
        }
        self.inner.complete(request, deltas).await
    }
}

fn boss(model: Arc<dyn Model>, store: Option<Arc<SqliteStore>>) -> Supervisor {
    let catalog = Catalog::builder()
        .model(model)
        .tool(echo() as Arc<dyn Tool>)
        .template(with_echo(template("boss")))
        .build()
        .unwrap();
    let sup = Supervisor::new(catalog, TreeLimits::default());
    match store {
        Some(store) => sup.with_store(store).unwrap(),
        None => sup,
    }
}

fn steers_in(history: &arbor_actors::History) -> Vec<String> {
    history
        .iter()
        .filter(|m| m.has_tag(STEERING))
        .map(|m| m.text())
        .collect()
}

/// Runs the boss with a steer sent during step 2; returns the root's final state.
async fn steered_run(sup: &Supervisor, gate: &Semaphore) -> Arc<arbor_actors::AgentState> {
    let mut rx = sup.subscribe();
    let mut seen = Vec::new();
    let handle = start(sup, "boss", "Find it.").await;
    wait_for(&mut rx, &mut seen, |e| {
        matches!(e.kind, EventKind::StepStarted { step: 2 })
    })
    .await;
    let root = handle.root_run_id.clone();
    sup.steer(&root, "Use metric units.").await.unwrap();
    gate.add_permits(1);
    finish(handle).await.state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_sent_mid_step_joins_the_history_at_the_next_step_and_is_journaled() {
    let gate = Arc::new(Semaphore::new(0));
    let model = Arc::new(Gated {
        inner: scripted(script()),
        gate: gate.clone(),
    });
    let sup = boss(model, None);
    let mut rx = sup.subscribe();
    let state = steered_run(&sup, &gate).await;
    assert_eq!(state.status, AgentStatus::Completed);
    let texts: Vec<String> = state.message_history.iter().map(|m| m.text()).collect();
    let at = texts.iter().position(|t| t == "Use metric units.").unwrap();
    assert_eq!(
        texts[at - 2],
        "Still looking.",
        "after step 2's reply and its result: {texts:?}"
    );
    assert_eq!(texts.last().unwrap(), "Done.");
    assert_eq!(steers_in(&state.message_history), ["Use metric units."]);
    let steered: Vec<(u32, String)> = drain(&mut rx)
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Steered { step, text } => Some((*step, text.to_string())),
            _ => None,
        })
        .collect();
    assert_eq!(steered, [(2, "Use metric units.".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_to_an_ended_an_unknown_or_an_empty_run_is_refused_with_the_reason() {
    let sup = boss(scripted(script()), None);
    let result = finish(start(&sup, "boss", "Find it.").await).await;
    let root = result.state.run_id.clone();
    let refused = |e: Error| match e {
        Error::SteerRefused { reason, .. } => Some(reason),
        _ => None,
    };
    assert_eq!(
        refused(sup.steer(&root, "more").await.unwrap_err()),
        Some(SteerRefused::Ended)
    );
    assert_eq!(
        refused(sup.steer(&root, "   ").await.unwrap_err()),
        Some(SteerRefused::Empty)
    );
    assert!(matches!(
        sup.steer(&rid("t9/0"), "hello").await.unwrap_err(),
        Error::UnknownRun(run) if run == "t9/0"
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steers_beyond_the_pending_cap_are_refused_and_the_run_takes_only_those_it_held() {
    let gate = Arc::new(Semaphore::new(0));
    let model = Arc::new(Gated {
        inner: scripted(script()),
        gate: gate.clone(),
    });
    let sup = boss(model, None).with_steer_limits(SteerLimits {
        max_pending: 3,
        max_pending_bytes: 64,
    });
    let mut rx = sup.subscribe();
    let mut seen = Vec::new();
    let handle = start(&sup, "boss", "Find it.").await;
    wait_for(&mut rx, &mut seen, |e| {
        matches!(e.kind, EventKind::StepStarted { step: 2 })
    })
    .await;
    let root = handle.root_run_id.clone();
    // Step 2 waits at the gate: nothing is taken meanwhile.
    for n in 1..=3 {
        sup.steer(&root, &format!("note {n}")).await.unwrap();
    }
    let full = |e: Error| match e {
        Error::SteerRefused {
            reason: SteerRefused::Full { pending, .. },
            ..
        } => Some(pending),
        _ => None,
    };
    assert_eq!(full(sup.steer(&root, "note 4").await.unwrap_err()), Some(3));
    let error = sup.steer(&root, "note 5").await.unwrap_err().to_string();
    assert!(error.contains("cap of 3 messages and 64 bytes"), "{error}");
    gate.add_permits(1);
    let state = finish(handle).await.state;
    assert_eq!(state.status, AgentStatus::Completed);
    assert_eq!(
        steers_in(&state.message_history),
        ["note 1", "note 2", "note 3"]
    );
}

/// A durable steered tree, cut after every record from the steer on (as if
/// the process died there) and resumed: it ends exactly as it did, the steer
/// applied once. And replayed on its recorded replies and steers, it matches.
#[test]
fn a_steered_tree_resumed_from_every_cut_after_the_steer_and_replayed_ends_as_it_did() {
    let rt = crate::store::runtime();
    let dir = tempfile::tempdir().unwrap();
    let whole_path = dir.path().join("whole.db");
    let whole = rt.block_on(async {
        let gate = Arc::new(Semaphore::new(0));
        let model = Arc::new(Gated {
            inner: scripted(script()),
            gate: gate.clone(),
        });
        let store = Arc::new(SqliteStore::open(&whole_path).unwrap());
        let sup = boss(model, Some(store));
        let state = steered_run(&sup, &gate).await;
        sup.flush().await.unwrap();
        (*state).clone()
    });
    assert_eq!(steers_in(&whole.message_history), ["Use metric units."]);
    let records = crate::store::records(&rusqlite::Connection::open(&whole_path).unwrap());
    let steer_at = records
        .iter()
        .position(|r| r["type"] == "steered")
        .expect("the steer is journaled");
    let mut checked = 0;
    for keep in steer_at + 1..records.len() {
        if records[keep - 1].get("seq").is_none() {
            continue;
        }
        let path = dir.path().join(format!("cut{keep}.db"));
        crate::store::cut(&whole_path, &path, &records, keep);
        let state = rt.block_on(async {
            let sup = boss(
                scripted(script()),
                Some(Arc::new(SqliteStore::open(&path).unwrap())),
            );
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
    assert!(checked >= 3, "{checked} cuts");

    // Replay: recorded replies and steers only, no store, no gate.
    rt.block_on(async {
        let store = SqliteStore::open(&whole_path).unwrap();
        let recovery = store.recovery(&as_tree("t")).unwrap();
        let (record, _) = store.tree(&as_tree("t")).unwrap();
        let sup = boss(scripted(json!({"replies": []})), None);
        let handle = sup
            .replay(record.request().unwrap(), recovery)
            .await
            .unwrap();
        let replayed = finish(handle).await.state;
        assert_eq!(*replayed, whole);
    });
}

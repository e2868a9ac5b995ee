//! Failures inside a tree (semantics §8): reported, retried or escalated, and a
//! panic anywhere is a failure, never a crash.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arbor_actors::handler::{FnHandler, FnProgram, Resume, Yield};
use arbor_actors::models::scripted::ScriptedModel;
use arbor_actors::{
    AgentStatus, DeltaSink, EventKind, FailurePolicy, Model, ModelError, ModelRequest,
    ModelResponse, Tool, ToolContext, ToolError, ToolOutput,
};
use arbor_supervisor::TreeLimits;
use async_trait::async_trait;
use serde_json::{Value, json};

use crate::common::*;

#[tokio::test(start_paused = true)]
async fn panics_errors_and_step_limits_are_error_values_beside_a_working_sibling() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[
                ("worker", "crash"), ("worker", "err"), ("looper", "loop"), ("worker", "fine")
            ])]},
            {"text": "survived"}
        ]},
        {"agent": "worker", "prompt": "crash", "steps": [{"panic": "model blew up", "delayMs": 10}]},
        {"agent": "worker", "prompt": "err", "steps": [{"error": "service down", "delayMs": 20}]},
        {"agent": "worker", "prompt": "fine", "steps": [{"text": "all good", "delayMs": 30}]},
        {"agent": "looper", "steps": [
            {"toolCalls": [{"name": "echo", "input": {"again": 1}}]},
            {"toolCalls": [{"name": "echo", "input": {"again": 2}}]},
            {"toolCalls": [{"name": "echo", "input": {"again": 3}}]}
        ]}
    ]}));
    let sup = supervisor(
        &model,
        vec![
            template("lead").spawns(&["worker", "looper"]),
            template("worker"),
            with_echo(template("looper")).max_steps(1),
        ],
        TreeLimits::default(),
    );
    let (result, events) = run(&sup, "lead", "go").await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    assert_eq!(last_text(&result.value), "survived");

    let entries = tool_result(&result.state, "spawn_agents");
    let errors: Vec<&str> = entries.as_array().unwrap()[..3]
        .iter()
        .map(|e| error_of(e).unwrap_or_else(|| panic!("not an error: {e}")))
        .collect();
    assert!(errors[0].contains("model blew up"), "{}", errors[0]);
    assert!(errors[1].contains("service down"), "{}", errors[1]);
    assert!(errors[2].contains("max_steps (agent)"), "{}", errors[2]);
    for e in &errors {
        assert!(!e.contains("stack backtrace"), "{e}");
    }
    assert_eq!(last_text(&entries[3]["value"]), "all good");

    // Every child has a final state; the three failures are `failed`.
    let states = final_states(&events);
    let statuses: Vec<AgentStatus> = result
        .state
        .child_run_ids
        .iter()
        .map(|id| states[id].status)
        .collect();
    assert_eq!(
        statuses,
        [
            AgentStatus::Failed,
            AgentStatus::Failed,
            AgentStatus::Failed,
            AgentStatus::Completed
        ]
    );
    // The looper took exactly its one step.
    let looper_steps = model
        .requests()
        .iter()
        .filter(|r| r.agent_type == "looper")
        .count();
    assert_eq!(looper_steps, 1);
}

/// A tool that panics.
struct Bomb;

#[async_trait]
impl Tool for Bomb {
    fn name(&self) -> &str {
        "bomb"
    }
    fn description(&self) -> &str {
        "Panics."
    }
    fn input_schema(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(&self, _input: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        panic!("bomb went off");
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_tool_fails_its_agent_not_the_process() {
    let script = json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("bomber", "boom"), ("worker", "calm")])]},
            {"text": "carried on"}
        ]},
        {"agent": "bomber", "steps": [
            {"toolCalls": [{"name": "bomb", "input": {}}]},
            {"text": "never reached"}
        ]},
        {"agent": "worker", "steps": [{"text": "calm"}]}
    ]});
    let model = scripted(script);
    let mut bomber = template("bomber");
    bomber.tools.push("bomb".to_owned());
    let sup = supervisor_with(
        &model,
        vec![
            template("lead").spawns(&["bomber", "worker"]),
            bomber,
            template("worker"),
        ],
        Vec::new(),
        vec![Arc::new(Bomb) as Arc<dyn Tool>],
        TreeLimits::default(),
    );
    let (result, _) = run(&sup, "lead", "go").await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    let entries = tool_result(&result.state, "spawn_agents");
    let error = error_of(&entries[0]).expect("the bomber failed");
    assert!(error.contains("bomb went off"), "{error}");
    assert_eq!(last_text(&entries[1]["value"]), "calm");
    let bomber = sup.finished_state(&result.state.child_run_ids[0]).unwrap();
    assert_eq!(bomber.status, AgentStatus::Failed);
    assert!(
        !model
            .requests()
            .iter()
            .any(|r| r.agent_type == "bomber" && r.step == 2)
    );

    // The supervisor still runs trees afterwards.
    let handle = sup
        .start(arbor_supervisor::StartRequest {
            tree_id: Some("t2".parse().unwrap()),
            ..request("worker", "again")
        })
        .await
        .unwrap();
    assert_eq!(finish(handle).await.state.status, AgentStatus::Completed);
    assert_eq!(sup.live_actors(), 0);
}

fn exploding_program(input: Resume<'_>) -> Yield {
    match input {
        Resume::Start { .. } => Yield::ToolCalls(vec![("echo".into(), json!({"n": 1}))]),
        Resume::ToolResults { .. } | Resume::StepsDone { .. } => panic!("program bug"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_step_handler_fails_its_agent_and_the_parent_goes_on() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("prog", "run"), ("worker", "calm")])]},
            {"text": "carried on"}
        ]},
        {"agent": "worker", "steps": [{"text": "calm"}]}
    ]}));
    let prog =
        with_echo(template("prog")).handler(Arc::new(FnHandler(|| FnProgram(exploding_program))));
    let sup = supervisor(
        &model,
        vec![
            template("lead").spawns(&["prog", "worker"]),
            prog,
            template("worker"),
        ],
        TreeLimits::default(),
    );
    let (result, events) = run(&sup, "lead", "go").await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    let entries = tool_result(&result.state, "spawn_agents");
    let error = error_of(&entries[0]).expect("the program failed");
    assert!(error.contains("program bug"), "{error}");
    assert_eq!(last_text(&entries[1]["value"]), "calm");
    // It failed after its tool ran: the echo call is in its kept history.
    let prog = sup.finished_state(&result.state.child_run_ids[0]).unwrap();
    assert_eq!(prog.status, AgentStatus::Failed);
    assert!(
        prog.message_history
            .iter()
            .any(|m| m.answers().is_some() && m.text().contains("echo"))
    );
    assert!(events.iter().any(|e| matches!(
        &e.kind,
        EventKind::AgentFailed { error, .. } if error.contains("program bug")
    )));
}

#[tokio::test(start_paused = true)]
async fn escalate_fails_the_parent_and_cancels_its_other_children() {
    let model = scripted(json!({"replies": [
        {"agent": "top", "steps": [
            {"toolCalls": [spawn_call(&[("lead", "lead it")])]},
            {"text": "top goes on"}
        ]},
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("bad", "fail"), ("slow", "take long")])]},
            {"text": "lead never gets here"}
        ]},
        {"agent": "bad", "steps": [{"error": "fatal", "delayMs": 100}]},
        {"agent": "slow", "steps": [
            {"toolCalls": [spawn_call(&[("leaf", "deep")])]},
            {"text": "slow done"}
        ]},
        {"agent": "leaf", "steps": [{"text": "leaf done", "delayMs": 60000}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![
            template("top").spawns(&["lead"]),
            template("lead").spawns(&["bad", "slow"]),
            template("bad").failure(FailurePolicy::Escalate),
            template("slow").spawns(&["leaf"]),
            template("leaf"),
        ],
        TreeLimits::default(),
    );
    let mut rx = sup.subscribe();
    let handle = start(&sup, "top", "go").await;
    let mut seen = Vec::new();
    wait_for(
        &mut rx,
        &mut seen,
        |e| matches!(&e.kind, EventKind::AgentStarted { agent_type, .. } if agent_type == "leaf"),
    )
    .await;
    assert_eq!(sup.live_actors(), 5, "top, lead, bad, slow and leaf");
    let started = tokio::time::Instant::now();
    let result = finish(handle).await;
    seen.extend(drain(&mut rx));
    // Ended by the failure at ~100ms, not by the leaf's minute.
    assert!(started.elapsed() < Duration::from_secs(1));

    assert_eq!(result.state.status, AgentStatus::Completed);
    assert_eq!(last_text(&result.value), "top goes on");
    let entries = tool_result(&result.state, "spawn_agents");
    let error = error_of(&entries[0]).expect("the lead failed");
    assert!(
        error.contains("child bad") && error.contains("fatal"),
        "{error}"
    );

    let states = final_states(&seen);
    let by_type = |t: &str| {
        let mut found: Vec<_> = states
            .values()
            .filter(|s| s.agent_type.as_deref() == Some(t))
            .collect();
        assert_eq!(found.len(), 1, "{t}");
        found.pop().unwrap().clone()
    };
    assert_eq!(by_type("lead").status, AgentStatus::Failed);
    assert_eq!(by_type("bad").status, AgentStatus::Failed);
    assert_eq!(by_type("slow").status, AgentStatus::Cancelled);
    assert_eq!(by_type("leaf").status, AgentStatus::Cancelled);
    // The lead records both of its children.
    assert_eq!(by_type("lead").child_run_ids.len(), 2);
    assert_eq!(sup.live_actors(), 0);
}

/// A model that fails the first call of every agent type in `flaky` and answers
/// the rest from the script.
struct FailFirst {
    inner: Arc<ScriptedModel>,
    seen: Mutex<HashSet<String>>,
}

#[async_trait]
impl Model for FailFirst {
    fn name(&self) -> &str {
        "flaky"
    }

    async fn complete(
        &self,
        request: ModelRequest,
        deltas: DeltaSink,
    ) -> Result<ModelResponse, ModelError> {
        let first = self
            .seen
            .lock()
            .unwrap()
            .insert(request.meta.agent_type.clone());
        if first {
            return Err(ModelError::Transient {
                model: "flaky".into(),
                message: "first call fails".into(),
                retry_after: None,
            });
        }
        self.inner.complete(request, deltas).await
    }
}

#[tokio::test(start_paused = true)]
async fn retry_runs_again_with_doubling_backoff_and_records_every_attempt() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("doomed", "never works"), ("once", "works second time")])]},
            {"text": "done"}
        ]},
        {"agent": "doomed", "steps": [{"error": "always down"}]},
        {"agent": "once", "steps": [{"text": "finally"}]}
    ]}));
    let flaky = Arc::new(FailFirst {
        inner: model.clone(),
        seen: Mutex::new(HashSet::new()),
    });
    let retry = FailurePolicy::Retry {
        max: 2,
        backoff: Duration::from_millis(100),
    };
    let sup = supervisor_with(
        &model,
        vec![
            template("lead").spawns(&["doomed", "once"]),
            template("doomed").failure(retry),
            arbor_actors::AgentTemplate::new("once", "flaky").failure(retry),
        ],
        vec![("flaky", flaky as Arc<dyn Model>)],
        vec![echo()],
        TreeLimits::default(),
    );
    let started = tokio::time::Instant::now();
    let (result, events) = run(&sup, "lead", "go").await;
    let elapsed = started.elapsed();
    assert_eq!(result.state.status, AgentStatus::Completed);

    let doomed = spawned(&events, "doomed");
    let once = spawned(&events, "once");
    assert_eq!(doomed.len(), 3, "{doomed:?}");
    assert_eq!(once.len(), 2, "{once:?}");
    assert!(doomed[1].attempt() == 1 && doomed[2].attempt() == 2);
    let all: Vec<RunId> = doomed.iter().chain(&once).cloned().collect();
    assert_eq!(
        result.state.child_run_ids, all,
        "every attempt, in request order"
    );

    let attempts: Vec<u32> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ChildSpawned {
                agent_type,
                attempt,
                ..
            } if agent_type == "doomed" => Some(*attempt),
            _ => None,
        })
        .collect();
    assert_eq!(attempts, [0, 1, 2]);

    let retries: Vec<(RunId, u32, u64)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ChildRetrying {
                failed_run_id,
                attempt,
                delay_ms,
                ..
            } => Some((failed_run_id.clone(), *attempt, *delay_ms)),
            _ => None,
        })
        .collect();
    let mut expected = vec![
        (doomed[0].clone(), 1, 100),
        (doomed[1].clone(), 2, 200),
        (once[0].clone(), 1, 100),
    ];
    let mut got = retries.clone();
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");

    let entries = tool_result(&result.state, "spawn_agents");
    let error = error_of(&entries[0]).expect("doomed failed");
    assert!(error.contains("always down"), "{error}");
    assert_eq!(entries[0]["runId"], doomed[2].to_string());
    assert_eq!(last_text(&entries[1]["value"]), "finally");
    assert_eq!(entries[1]["runId"], once[1].to_string());

    for id in &doomed {
        assert_eq!(sup.finished_state(id).unwrap().status, AgentStatus::Failed);
    }
    assert_eq!(
        sup.finished_state(&once[0]).unwrap().status,
        AgentStatus::Failed
    );
    assert_eq!(
        sup.finished_state(&once[1]).unwrap().status,
        AgentStatus::Completed
    );
}

/// Regression: the children of a retried attempt used to get the run ids of the
/// failed attempt's children (ids came from the agent id, the same for every attempt).
#[tokio::test(start_paused = true)]
async fn the_children_of_every_attempt_have_their_own_run_ids() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("mid", "go")])]},
            {"text": "done"}
        ]},
        // Every attempt of `mid` spawns a leaf, then fails.
        {"agent": "mid", "steps": [
            {"toolCalls": [spawn_call(&[("leaf", "work")])]},
            {"error": "mid broke"}
        ]},
        {"agent": "leaf", "steps": [{"text": "leaf done"}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![
            template("lead").spawns(&["mid"]),
            template("mid")
                .spawns(&["leaf"])
                .failure(FailurePolicy::Retry {
                    max: 1,
                    backoff: Duration::from_millis(10),
                }),
            template("leaf"),
        ],
        TreeLimits::default(),
    );
    let (result, events) = run(&sup, "lead", "go").await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    let started: Vec<String> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::AgentStarted { .. }))
        .map(|e| e.run_id.to_string())
        .collect();
    let unique: HashSet<&String> = started.iter().collect();
    assert_eq!(unique.len(), started.len(), "run ids repeat: {started:?}");
    // lead, two attempts of mid, one leaf under each attempt.
    assert_eq!(started.len(), 5, "{started:?}");
    assert!(started.contains(&"t/0.1~1.1".to_owned()), "{started:?}");
}

/// Regression: when a parent is cut short with one spawn call answered and an
/// earlier one still out, `childRunIds` keeps the request order.
#[tokio::test(start_paused = true)]
async fn child_run_ids_keep_request_order_when_a_step_is_cut_short() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [
                spawn_call(&[("bad", "fail later"), ("worker", "slow")]),
                spawn_call(&[("worker", "fast")])
            ]},
            {"text": "never"}
        ]},
        {"agent": "bad", "steps": [{"error": "broke", "delayMs": 100}]},
        {"agent": "worker", "prompt": "slow", "steps": [{"text": "slow done", "delayMs": 5000}]},
        {"agent": "worker", "prompt": "fast", "steps": [{"text": "fast done", "delayMs": 10}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![
            template("lead").spawns(&["bad", "worker"]),
            template("bad").failure(FailurePolicy::Escalate),
            template("worker"),
        ],
        TreeLimits::default(),
    );
    let (result, _) = run(&sup, "lead", "go").await;
    assert_eq!(result.state.status, AgentStatus::Failed);
    // The fast worker (second call) reported before the escalation; the slow one
    // (first call) was cancelled: still first call, then second.
    assert_eq!(
        result.state.child_run_ids,
        vec!["t/0.1".to_owned(), "t/0.2".to_owned(), "t/0.3".to_owned()]
    );
}

/// Whether a spawn result's `value` has the one shape of a child that did not
/// complete (semantics §7): an object whose only key is `errorMessage`, a
/// non-empty string (not a run's `{type: "error", message}` output value).
fn assert_error_message_only(what: &str, value: &Value) {
    let object = value
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object: {value}"));
    let keys: Vec<&str> = object.keys().map(String::as_str).collect();
    assert_eq!(keys, ["errorMessage"], "{what}: {value}");
    let message = value["errorMessage"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{what}: {value}");
}

/// Issue 12, defect 23: a child that failed (a model error, a panic), was
/// cancelled while it ran or before it started, or was refused (an unknown
/// type, a limit) is one shape in its `spawn_agents` entry, `{errorMessage}`
/// and nothing else; so is a failed or refused `spawn_agent_inline` result.
#[tokio::test(start_paused = true)]
async fn a_failed_childs_entry_has_one_shape_errormessage_whatever_the_cause() {
    let inline = |agent_type: &str, prompt: &str| {
        call(
            "spawn_agent_inline",
            json!({"agent_type": agent_type, "prompt": prompt}),
        )
    };
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[
                ("worker", "err"), ("worker", "crash"), ("sleeper", "run"),
                ("sleeper", "wait"), ("ghost", "x"), ("worker", "sixth")
            ])]},
            {"toolCalls": [inline("worker", "outage")]},
            {"toolCalls": [inline("ghost", "inline x")]},
            {"text": "done"}
        ]},
        {"agent": "worker", "prompt": "err", "steps": [{"error": "service down", "delayMs": 10}]},
        {"agent": "worker", "prompt": "crash", "steps": [{"panic": "model blew up", "delayMs": 10}]},
        {"agent": "worker", "prompt": "outage", "steps": [{"error": "inline down", "delayMs": 10}]},
        {"agent": "worker", "steps": [{"text": "never asked"}]},
        {"agent": "sleeper", "steps": [{"text": "slept", "delayMs": 3_600_000}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![
            template("lead").spawns(&["worker", "sleeper"]),
            template("worker"),
            template("sleeper"),
        ],
        TreeLimits {
            // One child steps at a time, so the second sleeper waits for
            // the first's slot; the sixth child of the call is refused.
            max_live_agents: std::num::NonZeroUsize::new(1),
            max_children_per_call: std::num::NonZeroUsize::new(5),
            ..TreeLimits::default()
        },
    );
    let mut rx = sup.subscribe();
    let handle = start(&sup, "lead", "go").await;
    let mut seen = Vec::new();
    wait_for(&mut rx, &mut seen, |e| {
        matches!(&e.kind, EventKind::AgentStarted { agent_type, .. } if agent_type == "sleeper")
    })
    .await;
    let sleepers = spawned(&seen, "sleeper");
    assert_eq!(sleepers.len(), 2, "{sleepers:?}");
    // The waiting one first (it never starts), then the running one.
    sup.cancel_run(&sleepers[1]).expect("the waiting sleeper");
    sup.cancel_run(&sleepers[0]).expect("the running sleeper");
    let result = finish(handle).await;
    seen.extend(drain(&mut rx));
    assert_eq!(result.state.status, AgentStatus::Completed);
    assert_eq!(last_text(&result.value), "done");
    assert!(
        !seen
            .iter()
            .any(|e| e.run_id == sleepers[1] && matches!(e.kind, EventKind::AgentStarted { .. })),
        "the waiting sleeper started"
    );

    let entries = tool_result(&result.state, "spawn_agents");
    let entries = entries.as_array().unwrap();
    assert_eq!(entries.len(), 6);
    let causes = [
        ("a model error", "service down"),
        ("a panic", "model blew up"),
        ("cancelled while it ran", "cancel"),
        ("cancelled before it started", "cancel"),
        ("a type it may not spawn", "ghost"),
        ("over max_children_per_call", "max_children_per_call"),
    ];
    for (entry, (cause, says)) in entries.iter().zip(causes) {
        assert_error_message_only(cause, &entry["value"]);
        let message = error_of(entry).unwrap();
        assert!(message.to_lowercase().contains(says), "{cause}: {message}");
    }
    let inline_results = tool_results(&result.state, "spawn_agent_inline");
    assert_eq!(inline_results.len(), 2, "{inline_results:?}");
    for (value, (cause, says)) in inline_results.iter().zip([
        ("a failed inline child", "inline down"),
        ("an inline type it may not spawn", "ghost"),
    ]) {
        assert_error_message_only(cause, value);
        let message = value["errorMessage"].as_str().unwrap();
        assert!(message.contains(says), "{cause}: {message}");
    }
}

//! Spawning and merging across a live tree (semantics §6, §7).

use std::time::Duration;

use arbor_actors::message::{Message, SUBAGENT_SPAWN};
use arbor_actors::schema::Schema;
use arbor_actors::{AgentState, AgentStatus, EventKind, OutputMode};
use arbor_supervisor::TreeLimits;
use serde_json::{Value, json};

use crate::common::*;

#[tokio::test(start_paused = true)]
async fn spawn_agents_merges_in_request_order_whatever_the_finish_order() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("worker", "task-a"), ("worker", "task-b"), ("worker", "task-c")])]},
            {"text": "merged"}
        ]},
        {"agent": "worker", "prompt": "task-a", "steps": [{"text": "A", "delayMs": 300}]},
        {"agent": "worker", "prompt": "task-b", "steps": [{"text": "B", "delayMs": 200}]},
        {"agent": "worker", "prompt": "task-c", "steps": [{"text": "C", "delayMs": 100}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![template("lead").spawns(&["worker"]), template("worker")],
        TreeLimits::default(),
    );
    let started = tokio::time::Instant::now();
    let (result, events) = run(&sup, "lead", "go").await;
    let elapsed = started.elapsed();

    assert_eq!(result.state.status, AgentStatus::Completed);
    // Concurrent: the slowest child, not the sum of all three.
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_millis(600),
        "{elapsed:?}"
    );

    let entries = tool_result(&result.state, "spawn_agents");
    let entries = entries.as_array().unwrap();
    let texts: Vec<String> = entries.iter().map(|e| last_text(&e["value"])).collect();
    assert_eq!(texts, ["A", "B", "C"]);
    for e in entries {
        assert_eq!(e["agentType"], "worker");
        assert_eq!(e["agentName"], "worker");
    }

    let entry_runs: Vec<RunId> = entries
        .iter()
        .map(|e| rid(e["runId"].as_str().unwrap()))
        .collect();
    assert_eq!(result.state.child_run_ids, entry_runs);
    // Each run id is the child that got that prompt.
    for (run_id, prompt) in entry_runs.iter().zip(["task-a", "task-b", "task-c"]) {
        let child = sup.finished_state(run_id).expect("child state kept");
        assert_eq!(child.message_history.get(0).unwrap().text(), prompt);
        assert_eq!(child.status, AgentStatus::Completed);
    }

    let finished: Vec<RunId> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ChildFinished { child_run_id, .. } => Some(child_run_id.clone()),
            _ => None,
        })
        .collect();
    let reversed: Vec<RunId> = entry_runs.iter().rev().cloned().collect();
    assert_eq!(finished, reversed, "children finish in reverse order");
}

#[tokio::test(start_paused = true)]
async fn a_three_level_tree_keeps_every_state_and_sums_credits() {
    let usage = |cost: f64| json!({"inputTokens": 10, "outputTokens": 5, "cost": cost});
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("mid", "m1"), ("mid", "m2")])], "usage": usage(1.0)},
            {"text": "all done", "usage": usage(1.0)}
        ]},
        {"agent": "mid", "steps": [
            {"toolCalls": [spawn_call(&[("leaf", "l1"), ("leaf", "l2")])], "usage": usage(0.5), "delayMs": 10},
            {"text": "mid done", "usage": usage(0.5)}
        ]},
        {"agent": "leaf", "steps": [{"text": "leaf done", "usage": usage(0.25), "delayMs": 20}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![
            template("lead").spawns(&["mid"]),
            template("mid").spawns(&["leaf"]),
            template("leaf"),
        ],
        TreeLimits::default(),
    );
    let handle = start(&sup, "lead", "build a tree").await;
    let root_run_id = handle.root_run_id.clone();
    let result = finish(handle).await;
    let root = result.state;
    assert_eq!(root.status, AgentStatus::Completed);
    assert_eq!(root.run_id, root_run_id);
    assert_eq!(root.parent_id, None);
    assert!(root.ancestor_run_ids.is_empty());
    assert_eq!(root.child_run_ids.len(), 2);

    // Walk the tree through the registry, checking each link.
    let mut runs = 0;
    let mut descendants_direct = 0.0;
    let mut stack: Vec<AgentState> = vec![AgentState::clone(&root)];
    while let Some(parent) = stack.pop() {
        runs += 1;
        let registered = sup.finished_state(&parent.run_id).expect("kept by run id");
        assert_eq!(*registered, parent);
        assert_eq!(sup.state(&parent.run_id).await.unwrap(), parent);
        let mut own_and_children = parent.direct_credits_used;
        for child_id in &parent.child_run_ids {
            let child = (*sup.finished_state(child_id).expect("child kept")).clone();
            assert_eq!(child.parent_id.as_ref(), Some(&parent.agent_id));
            let mut expected_ancestors = parent.ancestor_run_ids.to_vec();
            expected_ancestors.push(parent.run_id.clone());
            assert_eq!(*child.ancestor_run_ids, expected_ancestors);
            assert_eq!(child.status, AgentStatus::Completed);
            descendants_direct += child.direct_credits_used;
            own_and_children += child.credits_used;
            stack.push(child);
        }
        assert_eq!(
            parent.credits_used, own_and_children,
            "{}: creditsUsed = own + children's",
            parent.run_id
        );
    }
    assert_eq!(runs, 7);
    assert_eq!(root.direct_credits_used, 2.0);
    assert_eq!(descendants_direct, 2.0 * 1.0 + 4.0 * 0.25);
    assert_eq!(
        root.credits_used,
        root.direct_credits_used + descendants_direct
    );
    assert_eq!(root.credits_used, 5.0);
    // Leaves are at depth 2 below both mids.
    let leaf = sup
        .finished_state(
            &sup.finished_state(&root.child_run_ids[1])
                .unwrap()
                .child_run_ids[0],
        )
        .unwrap();
    assert_eq!(leaf.depth(), 2);
    assert_eq!(leaf.ancestor_run_ids[0], root.run_id);
}

#[tokio::test(start_paused = true)]
async fn spawn_agent_inline_replaces_the_parent_history_with_the_childs() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"text": "thinking", "toolCalls": [
                {"name": "spawn_agent_inline", "input": {"agent_type": "helper", "prompt": "help me"}}
            ]},
            {"text": "done"}
        ]},
        {"agent": "helper", "steps": [{"text": "helped", "delayMs": 50}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![template("lead").spawns(&["helper"]), template("helper")],
        TreeLimits::default(),
    );
    let (result, _) = run(&sup, "lead", "go").await;
    assert_eq!(result.state.status, AgentStatus::Completed);

    let requests = model.requests();
    let texts = |messages: &[std::sync::Arc<Message>]| -> Vec<(String, String)> {
        messages
            .iter()
            .map(|m| (m.role().to_owned(), m.text()))
            .collect()
    };
    let helper = requests.iter().find(|r| r.agent_type == "helper").unwrap();
    // The child starts from the parent's filtered history, then its prompt.
    assert_eq!(
        texts(&helper.messages),
        [
            ("user".to_owned(), "go".to_owned()),
            ("assistant".to_owned(), "thinking".to_owned()),
            ("user".to_owned(), "help me".to_owned()),
        ]
    );
    assert!(helper.messages[1].tool_calls().next().is_none());

    // The parent's next request is the child's history without the child's prompt.
    let lead2 = requests
        .iter()
        .find(|r| r.agent_type == "lead" && r.step == 2)
        .unwrap();
    assert_eq!(
        texts(&lead2.messages),
        [
            ("user".to_owned(), "go".to_owned()),
            ("assistant".to_owned(), "thinking".to_owned()),
            ("assistant".to_owned(), "helped".to_owned()),
        ]
    );
    let history: Vec<(String, String)> = result
        .state
        .message_history
        .iter()
        .map(|m| (m.role().to_owned(), m.text()))
        .collect();
    assert_eq!(history.len(), 4);
    assert_eq!(history[2].1, "helped");
    assert_eq!(history[3].1, "done");
    assert_eq!(result.state.child_run_ids.len(), 1);
    let child = sup
        .finished_state(&result.state.child_run_ids[0])
        .expect("inline child kept");
    assert_eq!(child.agent_type.as_deref(), Some("helper"));
    assert_eq!(child.status, AgentStatus::Completed);
}

#[tokio::test(start_paused = true)]
async fn children_send_inherited_history_and_system_prompt_to_the_model() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"text": "delegating", "toolCalls": [spawn_call(&[("historian", "recall"), ("heir", "inherit")])]},
            {"text": "done"}
        ]},
        {"agent": "historian", "steps": [{"text": "remembered"}]},
        {"agent": "heir", "steps": [{"text": "inherited"}]}
    ]}));
    let mut historian = template("historian")
        .system_prompt("HISTORIAN SYSTEM")
        .output_mode(OutputMode::AllMessages);
    historian.include_message_history = true;
    let mut heir = template("heir").system_prompt("HEIR SYSTEM");
    heir.inherit_parent_system_prompt = true;
    let sup = supervisor(
        &model,
        vec![
            template("lead")
                .system_prompt("LEAD SYSTEM")
                .spawns(&["historian", "heir"]),
            historian,
            heir,
        ],
        TreeLimits::default(),
    );
    let (result, _) = run(&sup, "lead", "the root task").await;
    assert_eq!(result.state.status, AgentStatus::Completed);

    let requests = model.requests();
    let historian = requests
        .iter()
        .find(|r| r.agent_type == "historian")
        .unwrap();
    assert_eq!(&*historian.system_prompt, "HISTORIAN SYSTEM");
    let roles_texts: Vec<(&str, String)> = historian
        .messages
        .iter()
        .map(|m| (m.role(), m.text()))
        .collect();
    assert_eq!(roles_texts.len(), 4, "{roles_texts:?}");
    assert_eq!(roles_texts[0], ("user", "the root task".to_owned()));
    // The parent's unfinished spawn call is filtered out, its text kept.
    assert_eq!(roles_texts[1], ("assistant", "delegating".to_owned()));
    assert!(historian.messages[1].tool_calls().next().is_none());
    assert!(historian.messages[2].has_tag(SUBAGENT_SPAWN));
    assert!(roles_texts[2].1.contains("historian"), "{roles_texts:?}");
    assert_eq!(roles_texts[3], ("user", "recall".to_owned()));
    assert_eq!(historian.tools, ["end_turn", "set_output"]);

    let heir = requests.iter().find(|r| r.agent_type == "heir").unwrap();
    assert_eq!(&*heir.system_prompt, "LEAD SYSTEM");
    // The parent's tools, with the heir's own built-ins: it spawns nothing,
    // so it is offered no spawn tool (issue 34).
    assert_eq!(heir.tools, ["end_turn", "set_output"]);
    let heir_texts: Vec<String> = heir.messages.iter().map(|m| m.text()).collect();
    assert_eq!(heir_texts, ["inherit"]);

    // all_messages drops exactly the inherited prefix.
    let entries = tool_result(&result.state, "spawn_agents");
    assert_eq!(entries[0]["value"]["type"], "allMessages");
    let added = entries[0]["value"]["value"].as_array().unwrap();
    assert_eq!(added.len(), 1, "{added:?}");
    assert_eq!(added[0]["role"], "assistant");
    assert_eq!(last_text(&entries[1]["value"]), "inherited");
}

#[tokio::test(start_paused = true)]
async fn unknown_and_forbidden_types_are_error_entries_beside_working_siblings() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("ghost", "x"), ("worker", "real"), ("other", "y")])]},
            {"text": "done"}
        ]},
        {"agent": "worker", "steps": [{"text": "worked"}]},
        {"agent": "other", "steps": [{"text": "should never run"}]}
    ]}));
    let sup = supervisor(
        &model,
        vec![
            template("lead").spawns(&["worker"]),
            template("worker"),
            template("other"),
        ],
        TreeLimits::default(),
    );
    let (result, events) = run(&sup, "lead", "go").await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    let entries = tool_result(&result.state, "spawn_agents");
    let entries = entries.as_array().unwrap();
    assert_eq!(entries.len(), 3);
    assert_eq!(error_of(&entries[0]), Some("Agent type ghost not found"));
    assert_eq!(last_text(&entries[1]["value"]), "worked");
    assert_eq!(
        error_of(&entries[2]),
        Some("Agent type lead is not allowed to spawn child agent type other")
    );
    assert_eq!(entries[0]["runId"], Value::Null);
    assert_eq!(
        result.state.child_run_ids,
        [entries[1]["runId"].as_str().unwrap()]
    );
    assert!(model.requests().iter().all(|r| r.agent_type != "other"));
    assert_eq!(spawned(&events, "worker").len(), 1);
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::ChildSpawned { .. }))
            .count(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn params_rejected_by_the_input_schema_are_an_error_entry() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [{"name": "spawn_agents", "input": {"agents": [
                {"agent_type": "counter", "prompt": "bad", "params": {"n": "three"}},
                {"agent_type": "counter", "prompt": "good", "params": {"n": 3}}
            ]}}]},
            {"text": "done"}
        ]},
        {"agent": "counter", "steps": [{"text": "counted"}]}
    ]}));
    let mut counter = template("counter");
    counter.input_schema.params = Some(
        Schema::compile(json!({
            "type": "object",
            "required": ["n"],
            "properties": {"n": {"type": "integer"}}
        }))
        .unwrap(),
    );
    let sup = supervisor(
        &model,
        vec![template("lead").spawns(&["counter"]), counter],
        TreeLimits::default(),
    );
    let (result, _) = run(&sup, "lead", "go").await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    let entries = tool_result(&result.state, "spawn_agents");
    let error = error_of(&entries[0]).expect("rejected");
    assert!(
        error.starts_with("Invalid params for agent counter: "),
        "{error}"
    );
    assert_eq!(last_text(&entries[1]["value"]), "counted");
    assert_eq!(result.state.child_run_ids.len(), 1);
    // Only the valid child reached the model, with its params.
    let counters: Vec<_> = model
        .requests()
        .into_iter()
        .filter(|r| r.agent_type == "counter")
        .collect();
    assert_eq!(counters.len(), 1);
    assert!(counters[0].messages[0].text().contains("\"n\":3"));
}

#[tokio::test(start_paused = true)]
async fn malformed_tool_calls_become_errors_the_model_reads() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [
                {"name": "echo", "input": "{\"broken\": "},
                {"name": "frobnicate", "input": {}},
                {"name": "echo", "input": {"fine": true}}
            ]},
            {"text": "recovered"}
        ]}
    ]}));
    let sup = supervisor(
        &model,
        vec![with_echo(template("lead"))],
        TreeLimits::default(),
    );
    let (result, events) = run(&sup, "lead", "go").await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    assert_eq!(last_text(&result.value), "recovered");

    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let second = &requests[1];
    let tool_messages: Vec<&Message> = second
        .messages
        .iter()
        .map(|m| &**m)
        .filter(|m| m.answers().is_some())
        .collect();
    assert_eq!(tool_messages.len(), 3);
    assert!(is_tool_error(tool_messages[0]));
    assert!(
        tool_messages[0].text().contains("not valid JSON"),
        "{}",
        tool_messages[0].text()
    );
    assert!(is_tool_error(tool_messages[1]));
    assert!(
        tool_messages[1]
            .text()
            .contains("Tool frobnicate not found"),
        "{}",
        tool_messages[1].text()
    );
    assert!(!is_tool_error(tool_messages[2]));
    assert!(tool_messages[2].text().contains("fine"));

    let errors: Vec<Option<String>> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCalled { error, .. } => Some(error.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 3);
    assert!(errors[0].is_some() && errors[1].is_some() && errors[2].is_none());
}

/// Siblings spawned from one parent with its history start their requests
/// with the same messages (what a provider's prompt cache can share), and
/// the request says how many: up to each one's own prompt.
#[tokio::test(start_paused = true)]
async fn siblings_with_the_parents_history_share_a_request_prefix_up_to_their_own_prompts() {
    let model = scripted(json!({"replies": [
        {"agent": "lead", "steps": [
            {"toolCalls": [spawn_call(&[("reader", "read part one"), ("reader", "read part two")])]},
            {"text": "merged"}
        ]},
        {"agent": "reader", "steps": [{"text": "read"}]}
    ]}));
    let mut reader = template("reader");
    reader.include_message_history = true;
    let sup = supervisor(
        &model,
        vec![template("lead").spawns(&["reader"]), reader],
        TreeLimits::default(),
    );
    let (result, _) = run(&sup, "lead", "read the book").await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    let requests = model.requests();
    let lead = requests.iter().find(|r| r.agent_type == "lead").unwrap();
    assert_eq!(lead.shared_prefix, 0, "a root shares nothing");
    let readers: Vec<_> = requests
        .iter()
        .filter(|r| r.agent_type == "reader")
        .collect();
    assert_eq!(readers.len(), 2);
    let n = readers[0].shared_prefix;
    assert_eq!(n, readers[1].shared_prefix);
    // The parent's prompt, its spawn call (unfinished calls filtered) and the
    // sub-agent notice: the same messages, in the same order.
    assert!(n >= 2, "{n}");
    let texts = |r: &arbor_actors::models::scripted::RecordedRequest| -> Vec<String> {
        r.messages[..n].iter().map(|m| m.text()).collect()
    };
    assert_eq!(texts(readers[0]), texts(readers[1]));
    assert_eq!(readers[0].messages[0].text(), "read the book");
    // Right after the prefix: each one's own prompt.
    let own: Vec<String> = readers.iter().map(|r| r.messages[n].text()).collect();
    let mut own_sorted = own.clone();
    own_sorted.sort();
    assert_eq!(own_sorted, ["read part one", "read part two"]);
}

/// An agent counts as alive from the moment its actor exists (its state built,
/// its actor registered), not from the runtime's first poll of it: at every
/// event before any agent ends, the agents alive by the events are exactly the
/// actors the tree holds. (The load test divided its peak memory by agents
/// counted from their first turn: an uncapped 11,111-agent tree held some
/// 5,000 actors while it counted about 540 alive.)
#[tokio::test(start_paused = true)]
async fn a_spawned_agent_counts_as_alive_before_the_runtime_first_polls_it() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex, OnceLock, Weak};

    use arbor_actors::models::{Latency, SimulatedConfig, SimulatedModel};
    use arbor_actors::{AgentTemplate, Model};
    use arbor_supervisor::{Catalog, Supervisor};

    let sim = SimulatedModel::new(
        "sim",
        SimulatedConfig {
            latency: Latency::Fixed(Duration::from_secs(1)),
            ..SimulatedConfig::tree(10, 2)
        },
    );
    let catalog = Catalog::builder()
        .model(Arc::new(sim) as Arc<dyn Model>)
        .template(AgentTemplate::new("node", "sim").spawns(&["node"]))
        .build()
        .unwrap();
    let sup = Arc::new(Supervisor::new(catalog, TreeLimits::default()));
    let this: Arc<OnceLock<Weak<Supervisor>>> = Arc::default();
    // Compared only once `start` has returned: the observer reads the
    // supervisor's tree map, which `start` may hold while the root starts.
    let checking = Arc::new(AtomicBool::new(false));
    /// What the observer saw.
    #[derive(Default)]
    struct Seen {
        /// Agents alive by the events.
        alive: i64,
        /// An agent has ended.
        ended: bool,
        /// Events at which the counts were compared.
        checked: usize,
        mismatches: Vec<String>,
    }
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let (sup_of, check, record) = (this.clone(), checking.clone(), seen.clone());
    sup.events().observe(move |e| {
        let mut seen = record.lock().unwrap();
        match e.kind {
            EventKind::AgentStarted { .. } => seen.alive += 1,
            EventKind::AgentFinished { .. }
            | EventKind::AgentFailed { .. }
            | EventKind::AgentCancelled { .. } => seen.ended = true,
            _ => {}
        }
        if seen.ended || !check.load(Ordering::Acquire) {
            return;
        }
        let Some(sup) = sup_of.get().and_then(Weak::upgrade) else {
            return;
        };
        let actors = sup.live_actors() as i64;
        seen.checked += 1;
        if actors != seen.alive {
            let why = format!(
                "{} at seq {}: {actors} actors, {} alive",
                e.kind.name(),
                e.seq,
                seen.alive
            );
            seen.mismatches.push(why);
        }
    });
    let _ = this.set(Arc::downgrade(&sup));
    let handle = start(&sup, "node", "go").await;
    checking.store(true, Ordering::Release);
    let result = finish(handle).await;
    assert_eq!(result.state.status, AgentStatus::Completed);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.alive, 111, "every agent started once");
    // Both waves of spawns (10 children, then 100 grandchildren) came before
    // the first end, each child and grandchild with events of its own.
    assert!(seen.checked > 200, "only {} events checked", seen.checked);
    assert!(
        seen.mismatches.is_empty(),
        "actors not counted alive: {:?}",
        &seen.mismatches[..seen.mismatches.len().min(5)]
    );
}

//! Spawning: plans in request order, the child's start state, results
//! merged in request order, inline children.

use super::*;

fn spawning_catalog() -> Vec<AgentTemplate> {
    let mut strict = AgentTemplate::new("strict", "m");
    strict.input_schema.params = Some(
        Schema::compile(
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        )
        .unwrap(),
    );
    let mut historian = AgentTemplate::new("historian", "m")
        .system_prompt("historian sys")
        .max_steps(7)
        .output_mode(OutputMode::AllMessages);
    historian.include_message_history = true;
    let mut clone = AgentTemplate::new("clone", "m").system_prompt("clone sys");
    clone.inherit_parent_system_prompt = true;
    vec![
        AgentTemplate::new("acme/researcher@1.0.0", "m").system_prompt("researcher sys"),
        AgentTemplate::new("writer", "m").system_prompt("writer sys"),
        AgentTemplate::new("planner", "m"),
        AgentTemplate::new("helper", "m").output_mode(OutputMode::LastMessage),
        strict,
        historian,
        clone,
    ]
}

fn spawner() -> AgentTemplate {
    let mut t = lead().spawns(&[
        "acme/researcher@1.0.0",
        "writer",
        "strict",
        "historian",
        "clone",
        "helper",
    ]);
    t.tools = vec!["add_message".into()];
    t
}

fn spawn_run(history: Vec<Message>) -> Run {
    Run::new(spawner(), spawning_catalog(), history)
}

fn spawn_reply(id: &str, agents: Value) -> Message {
    Message::assistant(
        Some("delegating".into()),
        vec![call(id, "spawn_agents", json!({"agents": agents}))],
    )
}

#[test]
fn spawn_agents_plans_children_in_request_order_with_permission_checks() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let (step, index, children) = run.spawn_reply_action(json!([
        {"agent_type": "researcher", "prompt": "r"},
        {"agent_type": "planner"},
        {"agent_type": "ghost"},
        {"agent_type": "writer", "prompt": "w", "params": {"k": 1}},
        {"agent_type": "acme/researcher@1.0.0"},
        {"agent_type": "acme/researcher@2.0.0"},
        {"agent_type": "strict", "params": {"n": "x"}},
        {"agent_type": "acme/researcher"}
    ]));
    assert_eq!((step, index), (1, 0));
    let outcome: Vec<Outcome> = children
        .iter()
        .map(|c| match c {
            Ok(plan) => {
                assert!(!plan.inline);
                Ok((
                    plan.agent_type.to_string(),
                    plan.prompt.as_deref().map(str::to_owned),
                ))
            }
            Err(e) => Err(e.clone()),
        })
        .collect();
    let ok = |t: &str, p: Option<&str>| Ok((t.to_owned(), p.map(str::to_owned)));
    let err = |t: &str, e: &str| Err((t.to_owned(), e.to_owned()));
    assert_eq!(
        outcome[..6].to_vec(),
        vec![
            ok("acme/researcher@1.0.0", Some("r")),
            err(
                "planner",
                "Agent type lead is not allowed to spawn child agent type planner"
            ),
            err("ghost", "Agent type ghost not found"),
            ok("writer", Some("w")),
            ok("acme/researcher@1.0.0", None),
            err(
                "acme/researcher@2.0.0",
                "Agent type acme/researcher@2.0.0 not found"
            ),
        ]
    );
    let Err((t, e)) = &outcome[6] else {
        panic!("strict child should be refused: {:?}", outcome[6])
    };
    assert_eq!(t, "strict");
    assert!(
        e.starts_with("Invalid params for agent strict: at /n"),
        "{e}"
    );
    assert_eq!(outcome[7], ok("acme/researcher@1.0.0", None));
    let writer = children[3].as_ref().unwrap();
    assert_eq!(writer.params.as_deref(), Some(&json!({"k": 1})));
    assert_eq!(&*writer.template.system_prompt, "writer sys");
}

/// Issue 12, defect 22: a prompt its input schema refuses is that child's
/// refusal, `Invalid prompt for agent T: …` (an absent prompt too), while a
/// sibling whose prompt fits is planned.
#[test]
fn a_prompt_the_childs_input_schema_refuses_is_an_invalid_prompt_refusal() {
    let mut terse = AgentTemplate::new("terse", "m");
    terse.input_schema.prompt =
        Some(Schema::compile(json!({"type": "string", "minLength": 5})).unwrap());
    let mut run = Run::new(
        lead().spawns(&["terse"]),
        vec![terse],
        vec![Message::user("task")],
    );
    request(run.start());
    let (_, _, children) = run.spawn_reply_action(json!([
        {"agent_type": "terse", "prompt": "go"},
        {"agent_type": "terse"},
        {"agent_type": "terse", "prompt": "a long task"}
    ]));
    for refused in &children[..2] {
        let Err((t, e)) = refused else {
            panic!(
                "refused by its prompt schema: {:?}",
                refused.as_ref().map(|p| &p.prompt)
            )
        };
        assert_eq!(t, "terse");
        assert!(e.starts_with("Invalid prompt for agent terse: "), "{e}");
    }
    let planned = children[2].as_ref().expect("a prompt that fits is planned");
    assert_eq!(planned.prompt.as_deref(), Some("a long task"));
}

impl Run {
    fn spawn_reply_action(&mut self, agents: Value) -> Spawn {
        let step = self.m.step();
        spawn_children(self.reply(spawn_reply(&format!("spawn-{step}"), agents)))
    }
}

#[test]
fn siblings_share_one_filtered_snapshot_without_the_spawn_call() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let (_, _, children) = run.spawn_reply_action(json!([
        {"agent_type": "writer"}, {"agent_type": "historian"}
    ]));
    let plans: Vec<&ChildPlan> = children.iter().map(|c| c.as_ref().unwrap()).collect();
    // The parent's history is [task, A(text, spawn call)]: the call is unanswered.
    let parent = &run.state().message_history;
    assert_eq!(parent.len(), 2);
    for plan in &plans {
        assert_eq!(
            hvalues(&plan.snapshot),
            vec![
                Message::user("task"),
                Message::assistant(Some("delegating".into()), vec![])
            ]
        );
        assert!(Arc::ptr_eq(
            plan.snapshot.get(0).unwrap(),
            parent.get(0).unwrap()
        ));
    }
    assert!(
        plans[0]
            .snapshot
            .iter()
            .zip(plans[1].snapshot.iter())
            .all(|(a, b)| Arc::ptr_eq(a, b))
    );
}

#[test]
fn spawn_results_come_back_as_one_array_in_request_order() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let credits_before = run.state().credits_used;
    let (step, index, _) = run.spawn_reply_action(json!([
        {"agent_type": "writer", "prompt": "a"},
        {"agent_type": "ghost"},
        {"agent_type": "researcher", "prompt": "b"},
        {"agent_type": "writer", "prompt": "c"}
    ]));
    let report =
        |agent_type: &str, id: &str, runs: &[&str], status, value: Value, credits| ChildReport {
            agent_type: agent_type.into(),
            agent_name: AgentTypeId::parse(agent_type).name.into(),
            agent_id: Some(rid(id).agent_id()),
            run_ids: runs.iter().map(|r| rid(r)).collect(),
            status,
            value,
            credits,
            history: None,
            error_kind: (status == AgentStatus::Failed).then_some(FailureKind::ModelInvalid),
        };
    let reports = vec![
        report(
            "writer",
            "T/0.1",
            &["T/0.1"],
            AgentStatus::Completed,
            json!({"type": "lastMessage", "value": []}),
            1.0,
        ),
        ChildReport::refused("ghost", "Agent type ghost not found"),
        // A failed child that was retried: both attempts are on record, both paid.
        report(
            "acme/researcher@1.0.0",
            "T/0.3",
            &["T/0.3", "T/0.3~1"],
            AgentStatus::Failed,
            json!({"errorMessage": "model exploded"}),
            0.25,
        ),
        report(
            "writer",
            "T/0.4",
            &["T/0.4"],
            AgentStatus::Completed,
            json!({"type": "structuredOutput", "value": {"x": 1}}),
            2.0,
        ),
    ];
    let req = request(run.m.spawn_done(step, index, reports, &run.cat));
    let h = run.history();
    assert_eq!(h.len(), 3, "only the one result is added: {h:?}");
    assert_eq!(h[2].answers(), Some("spawn-1"));
    assert!(!is_error(&h[2]));
    assert_eq!(
        result_value(&h[2]),
        json!([
            {"agentName": "writer", "agentType": "writer", "agentId": "T/0.1", "runId": "T/0.1",
             "value": {"type": "lastMessage", "value": []}},
            {"agentName": "ghost", "agentType": "ghost", "agentId": "", "runId": null,
             "value": {"errorMessage": "Agent type ghost not found"}},
            {"agentName": "researcher", "agentType": "acme/researcher@1.0.0", "agentId": "T/0.3",
             "runId": "T/0.3~1", "value": {"errorMessage": "model exploded"}},
            {"agentName": "writer", "agentType": "writer", "agentId": "T/0.4", "runId": "T/0.4",
             "value": {"type": "structuredOutput", "value": {"x": 1}}}
        ])
    );
    let s = run.state();
    assert_eq!(s.child_run_ids, ["T/0.1", "T/0.3", "T/0.3~1", "T/0.4"]);
    assert_eq!(s.credits_used, credits_before + 0.5 + 3.25);
    assert_eq!(s.direct_credits_used, 0.5);
    // A failed child never fails the parent.
    assert_eq!(s.status, AgentStatus::Running);
    assert_eq!(values(&req.messages.to_vec()), h);
    // A second delivery for the same call is ignored.
    assert!(
        run.m
            .spawn_done(step, index, Vec::new(), &run.cat)
            .is_empty()
    );
    assert_eq!(run.state().child_run_ids.len(), 4);
}

fn start_child(run: &Run, plan: &ChildPlan, n: u32) -> ChildStart {
    let own = toolbox(&plan.template);
    plan.start_from(
        &ParentInfo::of(run.state(), run.m.toolbox()),
        RunIds {
            agent_id: format!("tree-1/0.1~1.{n}").parse().unwrap(),
            run_id: format!("tree-1/0.1~1.{n}~1").parse().unwrap(),
        },
        own,
    )
}

/// A parent with a finished exchange, a dangling call and a turn-scoped note.
fn rich_parent() -> Run {
    let old = call(
        "old",
        "add_message",
        json!({"role": "user", "content": "x"}),
    );
    spawn_run(vec![
        Message::user("task").with_tag(SPAWN_PROMPT),
        Message::assistant(None, vec![old.clone()]),
        Message::tool_result(&old, json!({"ok": true})),
        Message::assistant(
            Some("thinking".into()),
            vec![call("dangling", "echo", json!({}))],
        ),
        Message::user("remember this turn").with_ttl(TimeToLive::UserPrompt),
    ])
}

/// Children of one spawn share their parent's lineage: one list, not a
/// vector and a string per ancestor copied into every child (issue 17).
#[test]
fn the_children_of_one_spawn_share_one_ancestor_list() {
    let mut run = rich_parent();
    request(run.start());
    let (_, _, children) = run.spawn_reply_action(json!([
        {"agent_type": "historian", "prompt": "a"},
        {"agent_type": "writer", "prompt": "b"}
    ]));
    let parent = ParentInfo::of(run.state(), run.m.toolbox());
    let start = |plan: &ChildPlan, n: u32| {
        plan.start_from(
            &parent,
            RunIds {
                agent_id: format!("tree-1/0.1~1.{n}").parse().unwrap(),
                run_id: format!("tree-1/0.1~1.{n}~1").parse().unwrap(),
            },
            toolbox(&plan.template),
        )
    };
    let a = start(children[0].as_ref().unwrap(), 1);
    let b = start(children[1].as_ref().unwrap(), 2);
    assert_eq!(*a.state.ancestor_run_ids, ["tree-1/0", "tree-1/0.1~1"]);
    assert!(Arc::ptr_eq(
        &a.state.ancestor_run_ids,
        &b.state.ancestor_run_ids
    ));
}

/// Children of one spawn share its history snapshot and, per agent type, its
/// spawn notice: one of each per call, not a history tail, a message and two
/// strings per child (issue 17).
#[test]
fn the_children_of_one_spawn_share_one_snapshot_and_notice() {
    let mut run = rich_parent();
    request(run.start());
    let (_, _, children) = run.spawn_reply_action(json!([
        {"agent_type": "historian", "prompt": "a"},
        {"agent_type": "historian", "prompt": "b"},
        {"agent_type": "writer", "prompt": "c"}
    ]));
    let plans: Vec<&ChildPlan> = children.iter().map(|c| c.as_ref().unwrap()).collect();
    assert!(Arc::ptr_eq(&plans[0].snapshot, &plans[1].snapshot));
    assert!(Arc::ptr_eq(&plans[0].snapshot, &plans[2].snapshot));
    let (a, b) = (plans[0].notice.as_ref(), plans[1].notice.as_ref());
    assert!(
        Arc::ptr_eq(a.unwrap(), b.unwrap()),
        "one notice per agent type"
    );
    assert!(
        plans[2].notice.is_none(),
        "a writer inherits no history: {plans:?}"
    );

    let first = start_child(&run, plans[0], 1);
    let second = start_child(&run, plans[1], 2);
    let at = plans[0].snapshot.len();
    let (na, nb) = (
        first.state.message_history.get(at).unwrap(),
        second.state.message_history.get(at).unwrap(),
    );
    assert!(na.has_tag(SUBAGENT_SPAWN), "{na:?}");
    assert!(
        Arc::ptr_eq(na, nb),
        "the started children hold the one notice"
    );
    assert_eq!(
        first.state.message_history.len(),
        at + 2,
        "the notice, then the prompt"
    );
}

#[test]
fn a_child_starts_from_its_parent_as_the_spec_says() {
    let mut run = rich_parent();
    request(run.start());
    let (_, _, children) = run.spawn_reply_action(json!([
        {"agent_type": "historian", "prompt": "dig", "params": {"depth": 2}},
        {"agent_type": "writer", "prompt": "write"},
        {"agent_type": "clone"}
    ]));
    let plans: Vec<&ChildPlan> = children.iter().map(|c| c.as_ref().unwrap()).collect();
    let parent = run.state().clone();
    assert!(parent.context_token_count > 0);

    // With includeMessageHistory: the filtered history, the spawn notice, the prompt.
    let c = start_child(&run, plans[0], 1);
    let s = &c.state;
    assert_eq!(s.agent_id, "tree-1/0.1~1.1");
    assert_eq!(s.run_id, "tree-1/0.1~1.1~1");
    assert_eq!(s.parent_id, Some(rid("tree-1/0.1").agent_id()));
    assert_eq!(s.agent_type.as_deref(), Some("historian"));
    assert_eq!(*s.ancestor_run_ids, ["tree-1/0", "tree-1/0.1~1"]);
    assert!(s.child_run_ids.is_empty());
    assert_eq!(s.steps_remaining, 7);
    assert_eq!((s.credits_used, s.direct_credits_used), (0.0, 0.0));
    assert_eq!(s.context_token_count, parent.context_token_count);
    assert_eq!(s.status, AgentStatus::Running);
    assert_eq!(s.output, None);
    assert_eq!(&*s.system_prompt, "historian sys");
    let h = hvalues(&s.message_history);
    let filtered = hvalues(&parent.message_history.filter_unfinished_tool_calls());
    assert_eq!(
        filtered.len(),
        6,
        "the spawn call and the dangling call are gone"
    );
    assert_eq!(
        filtered
            .iter()
            .map(|m| m.tool_calls().count())
            .sum::<usize>(),
        1
    );
    assert_eq!(h[..6], filtered[..]);
    assert!(h[6].has_tag(SUBAGENT_SPAWN));
    assert!(matches!(h[6], Message::User { .. }));
    assert!(h[6].text().contains("historian"), "{}", h[6].text());
    assert!(h[7].has_tag(SPAWN_PROMPT));
    assert_eq!(
        h[7],
        Message::User {
            content: Content::Parts(vec![
                Part::Text { text: "dig".into() },
                Part::Text {
                    text: "Params: {\"depth\":2}".into()
                }
            ]),
            meta: h[7].meta().clone(),
        }
    );
    assert_eq!(h.len(), 8);
    assert_eq!(c.inherited, 8);
    // Inherited bodies are shared with the parent, not copied.
    assert!(Arc::ptr_eq(
        s.message_history.get(0).unwrap(),
        parent.message_history.get(0).unwrap()
    ));

    // Without it: only the prompt.
    let c = start_child(&run, plans[1], 2);
    assert_eq!(
        hvalues(&c.state.message_history),
        vec![Message::user("write").with_tag(SPAWN_PROMPT)]
    );
    assert_eq!(c.inherited, 1);
    assert_eq!(&*c.state.system_prompt, "writer sys");
    assert_eq!(c.state.steps_remaining, 20);
    assert!(!c.state.tool_definitions.contains_key("spawn_agents"));

    // inheritParentSystemPrompt: the parent's system prompt and tools, with
    // its own built-ins: the parent's spawn tools would refuse its every
    // call, as it may spawn nothing (issue 34).
    let c = start_child(&run, plans[2], 3);
    assert_eq!(&*c.state.system_prompt, "lead sys");
    assert!(parent.tool_definitions.contains_key("spawn_agents"));
    assert!(!c.state.tool_definitions.contains_key("spawn_agents"));
    assert!(
        parent
            .tool_definitions
            .keys()
            .filter(|name| !name.starts_with("spawn_"))
            .all(|name| c.state.tool_definitions.contains_key(name))
    );
    assert!(c.state.message_history.is_empty(), "no prompt, no history");
}

/// Runs a child machine from its start state until it finishes.
fn child_machine(plan: &ChildPlan, start: ChildStart) -> Run {
    let m = StepMachine::new(
        start.state,
        plan.template.clone(),
        start.toolbox,
        start.inherited,
        "tree-1".parse().unwrap(),
    )
    .with_input(plan.prompt.as_deref(), plan.params.as_deref());
    Run {
        m,
        cat: catalog(Vec::new()),
    }
}

#[test]
fn all_messages_output_drops_exactly_the_inherited_prefix() {
    let mut run = rich_parent();
    request(run.start());
    let (_, _, children) =
        run.spawn_reply_action(json!([{"agent_type": "historian", "prompt": "dig"}]));
    let plan = children[0].as_ref().unwrap();
    let start = start_child(&run, plan, 1);
    let inherited = start.inherited;
    let mut child = child_machine(plan, start);
    let req = request(child.start());
    assert_eq!(req.messages.len(), inherited);
    request(child.reply(Message::assistant(
        Some("noting".into()),
        vec![call("n1", "end_turn_not", json!({}))],
    )));
    finish(child.reply(Message::assistant_text("found it")));
    let value = child.m.output_value();
    assert_eq!(value["type"], "allMessages");
    let added: Vec<Message> = serde_json::from_value(value["value"].clone()).unwrap();
    assert_eq!(added.len(), 3, "{added:?}");
    assert_eq!(added[0].tool_calls().next().unwrap().tool_call_id, "n1");
    assert_eq!(added[1].answers(), Some("n1"));
    assert_eq!(added[2], Message::assistant_text("found it"));
}

#[test]
fn inline_spawn_hands_the_history_over_and_takes_it_back() {
    let mut run = spawn_run(vec![Message::user("task").with_tag(SPAWN_PROMPT)]);
    request(run.start());
    let actions = run.reply(Message::assistant(
        None,
        vec![call(
            "in-1",
            "spawn_agent_inline",
            json!({"agent_type": "helper", "prompt": "do it"}),
        )],
    ));
    let (step, index, plan) = inline_child(actions);
    assert!(plan.inline);
    assert_eq!(&*plan.agent_type, "helper");
    let start = start_child(&run, &plan, 1);
    // An inline child starts from the filtered history, then its prompt.
    let initial = hvalues(&start.state.message_history);
    assert_eq!(
        initial,
        vec![
            Message::user("task").with_tag(SPAWN_PROMPT),
            Message::user("do it").with_tag(SPAWN_PROMPT),
        ]
    );
    let mut final_history = start.state.message_history.clone();
    final_history.push(Message::assistant_text("working"));
    final_history.push(Message::user("scratch").with_ttl(TimeToLive::UserPrompt));
    final_history.push(Message::assistant_text("done"));
    let report = ChildReport {
        agent_type: "helper".into(),
        agent_name: "helper".into(),
        agent_id: Some(rid("tree-1/0.1~1.1").agent_id()),
        run_ids: vec![rid("tree-1/0.1~1.1~1")],
        status: AgentStatus::Completed,
        value: json!({"type": "lastMessage", "value": []}),
        credits: 2.0,
        history: Some(final_history),
        error_kind: None,
    };
    let before = run.state().credits_used;
    let req = request(run.m.inline_done(step, index, report, &run.cat));
    // The parent's history is the child's, minus the child's prompt and expired messages.
    let expected = vec![
        Message::user("task").with_tag(SPAWN_PROMPT),
        Message::assistant_text("working"),
        Message::assistant_text("done"),
    ];
    assert_eq!(run.history(), expected);
    assert_eq!(values(&req.messages.to_vec()), expected);
    assert_eq!(run.state().child_run_ids, ["tree-1/0.1~1.1~1"]);
    assert_eq!(run.state().credits_used, before + 2.0);
}

#[test]
fn inline_spawn_alongside_other_calls_keeps_their_results() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let actions = run.reply(Message::assistant(
        None,
        vec![
            call(
                "in-1",
                "spawn_agent_inline",
                json!({"agent_type": "helper"}),
            ),
            call("g-1", "grep", json!({})),
            call(
                "in-2",
                "spawn_agent_inline",
                json!({"agent_type": "helper"}),
            ),
        ],
    ));
    let (step, index, plan) = inline_child(actions);
    assert_eq!(index, 0);
    let mut final_history = History::clone(&plan.snapshot);
    final_history.push(Message::assistant_text("merged"));
    let report = ChildReport {
        agent_type: "helper".into(),
        agent_name: "helper".into(),
        agent_id: Some(rid("tree-1/0.1~1.1").agent_id()),
        run_ids: vec![rid("tree-1/0.1~1.1~1")],
        status: AgentStatus::Completed,
        value: json!({}),
        credits: 0.0,
        history: Some(final_history),
        error_kind: None,
    };
    let req = request(run.m.inline_done(step, index, report, &run.cat));
    let h = run.history();
    assert_eq!(h[0], Message::user("task"));
    assert_eq!(h[1], Message::assistant_text("merged"));
    let ids: Vec<&str> = h[2].tool_calls().map(|c| c.tool_call_id.as_str()).collect();
    assert_eq!(ids, ["g-1", "in-2"]);
    assert!(error_text(&h[3]).contains("grep"));
    assert!(error_text(&h[4]).contains("Only one spawn_agent_inline"));
    assert_eq!(h.len(), 5);
    assert_eq!(values(&req.messages.to_vec()), h);
}

#[test]
fn a_failed_inline_child_is_an_error_result_and_the_history_stays() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let (step, index, plan) = inline_child(run.reply(Message::assistant(
        None,
        vec![call(
            "in-1",
            "spawn_agent_inline",
            json!({"agent_type": "helper"}),
        )],
    )));
    let mut child_history = History::clone(&plan.snapshot);
    child_history.push(Message::assistant_text("half done"));
    let report = ChildReport {
        agent_type: "helper".into(),
        agent_name: "helper".into(),
        agent_id: Some(rid("tree-1/0.1~1.1").agent_id()),
        run_ids: vec![rid("tree-1/0.1~1.1~1")],
        status: AgentStatus::Failed,
        value: json!({"errorMessage": "it broke"}),
        credits: 0.75,
        history: Some(child_history),
        error_kind: Some(FailureKind::ModelInvalid),
    };
    let before = run.state().credits_used;
    request(run.m.inline_done(step, index, report, &run.cat));
    let h = run.history();
    assert_eq!(h.len(), 3);
    assert_eq!(h[0], Message::user("task"));
    assert_eq!(h[1].tool_calls().next().unwrap().tool_call_id, "in-1");
    assert_eq!(error_text(&h[2]), "it broke");
    assert_eq!(run.state().child_run_ids, ["tree-1/0.1~1.1~1"]);
    assert_eq!(run.state().credits_used, before + 0.75);
    assert_eq!(run.state().status, AgentStatus::Running);
}

#[test]
fn spawn_errors_before_any_child_starts_are_error_results() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let req = request(run.reply(Message::assistant(
        None,
        vec![
            call("a", "spawn_agents", json!({"agents": []})),
            call("b", "spawn_agent_inline", json!({"agent_type": "planner"})),
        ],
    )));
    let h = run.history();
    assert!(error_text(&h[2]).contains("Invalid input for spawn_agents"));
    assert_eq!(
        error_text(&h[3]),
        "Agent type lead is not allowed to spawn child agent type planner"
    );
    assert_eq!(values(&req.messages.to_vec()), h);
}

#[test]
fn one_invalid_spawn_agents_entry_is_refused_alone_and_the_valid_ones_run() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let (_, _, children) = run.spawn_reply_action(json!([
        {"agent_type": ""},
        {"agent_type": "writer", "prompt": "go"},
        {"prompt": "no type"},
        {"agent_type": "historian", "prompt": 7}
    ]));
    assert_eq!(children.len(), 4);
    let Err((t, e)) = &children[0] else {
        panic!(
            "an empty agent_type should be refused: {:?}",
            children[0].is_ok()
        )
    };
    assert_eq!(t, "");
    assert!(
        e.starts_with("Invalid input for spawn_agents: agents[0]"),
        "{e}"
    );
    assert_eq!(&*children[1].as_ref().unwrap().agent_type, "writer");
    assert!(matches!(&children[2], Err((t, e)) if t.is_empty() && e.contains("agents[2]")));
    assert!(matches!(&children[3], Err((t, e)) if t == "historian" && e.contains("agents[3]")));
}

#[test]
fn a_child_report_larger_than_its_share_of_the_parents_window_is_cut_with_a_note() {
    let mut parent = spawner();
    parent.context_window = Some(1_000);
    parent.report_share = arbor_actors::template::Share::new(0.25).unwrap();
    let mut run = Run::new(parent, spawning_catalog(), vec![Message::user("task")]);
    request(run.start());
    let (step, index, _) = run.spawn_reply_action(json!([
        {"agent_type": "writer", "prompt": "short"},
        {"agent_type": "writer", "prompt": "long"}
    ]));
    // The reply used 120 tokens: 880 are left, a quarter is 220 tokens (880 bytes).
    assert_eq!(run.state().context_token_count, 120);
    let report = |id: &str, value: Value| ChildReport {
        agent_type: "writer".into(),
        agent_name: "writer".into(),
        agent_id: Some(rid(&format!("T/0.{id}")).agent_id()),
        run_ids: vec![rid(&format!("T/0.{id}"))],
        status: AgentStatus::Completed,
        value,
        credits: 0.0,
        history: None,
        error_kind: None,
    };
    let short = json!({"type": "lastMessage", "value": "fine"});
    let long = json!({"type": "lastMessage", "value": "y".repeat(5_000)});
    let reports = vec![report("1", short.clone()), report("2", long.clone())];
    request(run.m.spawn_done(step, index, reports, &run.cat));
    let entries = result_value(&run.history()[2]);
    assert_eq!(entries[0]["value"], short, "under the share: untouched");
    let cut = &entries[1]["value"];
    assert_eq!(cut["type"], "truncated");
    assert_eq!(cut["text"].as_str().unwrap().len(), 880);
    assert_eq!(cut["runId"], "T/0.2");
    let full = long.to_string().len();
    assert_eq!(cut["cutBytes"], json!(full - 880));
    let note = cut["note"].as_str().unwrap();
    assert!(note.contains("arbor show T/0.2"), "{note}");
    assert_eq!(entries[1]["runId"], "T/0.2");
}

#[test]
fn without_a_context_window_a_large_report_is_not_cut() {
    let mut run = spawn_run(vec![Message::user("task")]);
    request(run.start());
    let (step, index, _) = run.spawn_reply_action(json!([{"agent_type": "writer"}]));
    let long = json!({"type": "lastMessage", "value": "y".repeat(50_000)});
    let report = ChildReport {
        agent_type: "writer".into(),
        agent_name: "writer".into(),
        agent_id: Some(rid("T/0.1").agent_id()),
        run_ids: vec![rid("T/0.1")],
        status: AgentStatus::Completed,
        value: long.clone(),
        credits: 0.0,
        history: None,
        error_kind: None,
    };
    request(run.m.spawn_done(step, index, vec![report], &run.cat));
    assert_eq!(result_value(&run.history()[2])[0]["value"], long);
}

/// Issue 12, defect 18: a child with a small `context_window` whose history
/// has grown far past it still sends its task: the request the machine
/// builds keeps the spawn prompt and the instructions at its head, and cuts
/// the oldest work after them.
#[test]
fn a_request_cut_to_the_context_window_still_holds_the_agents_prompt_and_instructions() {
    let mut reader = AgentTemplate::new("reader", "m");
    reader.tools = vec!["add_message".into()];
    reader.instructions_prompt = Some(Arc::from("the instructions"));
    reader.context_window = Some(300);
    let mut run = Run::new(
        lead().spawns(&["reader"]),
        vec![reader],
        vec![Message::user("task")],
    );
    request(run.start());
    let (_, _, children) =
        run.spawn_reply_action(json!([{"agent_type": "reader", "prompt": "the task"}]));
    let plan = children[0].as_ref().unwrap();
    let mut child = child_machine(plan, start_child(&run, plan, 1));
    let first = request(child.start());
    let texts =
        |req: &ModelRequest| -> Vec<String> { req.messages.iter().map(|m| m.text()).collect() };
    assert_eq!(texts(&first), ["the task", "the instructions"]);

    // Four steps of about 1000 estimated tokens each (a long reply and a
    // long note), far past the 300-token window.
    let long = |step: usize| format!("step {step} {}", "x".repeat(2000));
    let mut last = first;
    for step in 1..=4 {
        let (name, input) = add_user(&long(step));
        let reply = Message::assistant(
            Some(long(step)),
            vec![call(&format!("s{step}"), name, input)],
        );
        last = request(child.reply(reply));
    }
    assert!(
        child.state().message_history.len() > last.messages.len(),
        "the history is cut for the request: {:?}",
        texts(&last)
    );
    let sent = texts(&last);
    assert_eq!(sent[0], "the task", "{sent:?}");
    assert!(last.messages.iter().next().unwrap().has_tag(SPAWN_PROMPT));
    assert_eq!(sent[1], "the instructions", "{sent:?}");
    assert!(
        sent[2].contains("removed to fit the context window"),
        "{sent:?}"
    );
    // The newest work is what is kept after them.
    assert!(sent.last().unwrap().starts_with("step 4"), "{sent:?}");
    // The history itself is whole.
    assert_eq!(child.history()[0].text(), "the task");
}

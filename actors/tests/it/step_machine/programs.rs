//! Programmatic agents (step handlers): yields, the step limit, call ids.

use super::*;

#[test]
fn a_program_yields_tool_calls_then_lets_the_model_finish_the_turn() {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let handler = FnHandler(move || {
        let log = log.clone();
        let mut stage = 0;
        FnProgram(move |resume: Resume<'_>| {
            stage += 1;
            let mut log = log.lock().unwrap();
            match resume {
                Resume::Start {
                    prompt,
                    params,
                    state,
                } => {
                    log.push(format!(
                        "start {prompt:?} {} {}",
                        params.unwrap(),
                        state.steps_remaining
                    ));
                    Yield::ToolCalls(vec![
                        (
                            "add_message".into(),
                            json!({"role": "user", "content": "from program"}),
                        ),
                        ("grep".into(), json!({})),
                        ("set_output".into(), json!({"phase": 1})),
                    ])
                }
                Resume::ToolResults { results, state } => {
                    for r in &results {
                        log.push(format!(
                            "result {} error={}",
                            r.answers().unwrap(),
                            r.has_tag(TOOL_CALL_ERROR)
                        ));
                    }
                    log.push(format!("output {}", state.output.clone().unwrap()));
                    Yield::StepAll
                }
                Resume::StepsDone { turn_ended, .. } => {
                    log.push(format!("steps done {turn_ended} at stage {stage}"));
                    Yield::Done
                }
            }
        })
    });
    let mut t = AgentTemplate::new("prog", "m")
        .max_steps(5)
        .handler(Arc::new(handler));
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t).with_input(Some("go"), Some(json!({"k": 1})));
    let req = request(run.start());
    // The tool batch cost one step, the model step another.
    assert_eq!(req.meta.step, 2);
    assert_eq!(run.state().steps_remaining, 3);
    let h = run.history();
    assert_eq!(h.len(), 6, "{h:?}");
    let ids: Vec<&str> = h[1].tool_calls().map(|c| c.tool_call_id.as_str()).collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(h[5], Message::user("from program"));
    assert_eq!(values(&req.messages.to_vec()), h);
    finish(run.reply(Message::assistant_text("model done")));
    assert_eq!(run.state().status, AgentStatus::Completed);
    assert_eq!(run.state().output, Some(json!({"phase": 1})));
    let log = seen.lock().unwrap().clone();
    assert_eq!(
        log,
        vec![
            "start Some(\"go\") {\"k\":1} 5".to_owned(),
            format!("result {} error=false", ids[0]),
            format!("result {} error=true", ids[1]),
            format!("result {} error=false", ids[2]),
            "output {\"phase\":1}".to_owned(),
            "steps done true at stage 3".to_owned(),
        ]
    );
}

#[test]
fn a_program_is_held_to_the_step_limit() {
    // (A tool that does not end the turn: an `end_turn` now ends it.)
    let handler = FnHandler(|| {
        FnProgram(|_: Resume<'_>| Yield::ToolCalls(vec![("no_such_tool".into(), json!({}))]))
    });
    let mut run = Run::solo(
        AgentTemplate::new("prog", "m")
            .max_steps(3)
            .handler(Arc::new(handler)),
    );
    finish(run.start());
    assert_eq!(run.state().status, AgentStatus::Failed);
    assert!(run.state().error_message().unwrap().contains("max_steps"));
    assert_eq!(run.m.step(), 3);
    // Three batches, each an assistant message and its result.
    assert_eq!(run.history().len(), 7);
}

#[test]
fn a_program_that_takes_single_steps_sees_each_one() {
    let turns: Arc<Mutex<Vec<bool>>> = Arc::default();
    let log = turns.clone();
    let handler = FnHandler(move || {
        let log = log.clone();
        FnProgram(move |resume: Resume<'_>| match resume {
            Resume::Start { .. } => Yield::Step,
            Resume::StepsDone { turn_ended, .. } => {
                log.lock().unwrap().push(turn_ended);
                if turn_ended { Yield::Done } else { Yield::Step }
            }
            Resume::ToolResults { .. } => Yield::Done,
        })
    });
    let mut t = AgentTemplate::new("prog", "m").handler(Arc::new(handler));
    t.tools = vec!["add_message".into()];
    let mut run = Run::solo(t);
    request(run.start());
    // A step with a non-ending call hands control back to the program.
    request(run.reply(calls("s1", &[add_user("n")])));
    finish(run.reply(Message::assistant_text("ok")));
    assert_eq!(*turns.lock().unwrap(), vec![false, true]);
    assert_eq!(run.state().status, AgentStatus::Completed);
}

#[test]
fn program_call_ids_never_collide_with_inherited_ones() {
    // A programmatic child that inherited a program's history: its own first
    // batch must not reuse an id already in the history.
    let inherited = call(
        "prog-1-0",
        "add_message",
        json!({"role": "user", "content": "old"}),
    );
    let handler = FnHandler(|| {
        FnProgram(|resume: Resume<'_>| match resume {
            Resume::Start { .. } => Yield::ToolCalls(vec![(
                "add_message".into(),
                json!({"role": "user", "content": "new"}),
            )]),
            Resume::ToolResults { .. } => Yield::StepAll,
            Resume::StepsDone { .. } => Yield::Done,
        })
    });
    let mut t = AgentTemplate::new("prog", "m").handler(Arc::new(handler));
    t.tools = vec!["add_message".into()];
    let mut run = Run::new(
        t,
        Vec::new(),
        vec![
            Message::assistant(None, vec![inherited.clone()]),
            Message::tool_result(&inherited, json!({"ok": true})),
            Message::user("old"),
        ],
    );
    let req = request(run.start());
    assert_eq!(
        req.messages
            .iter()
            .filter(|m| m.answers().is_some())
            .count(),
        2
    );
    assert_eq!(req.messages.len(), 6);
}

#[test]
fn a_program_that_yields_end_turn_is_not_resumed_for_later_yields() {
    let resumed = Arc::new(std::sync::Mutex::new(0));
    let seen = resumed.clone();
    let handler = FnHandler(move || {
        let seen = seen.clone();
        FnProgram(move |resume: Resume<'_>| match resume {
            Resume::Start { .. } => Yield::ToolCalls(vec![("end_turn".into(), json!({}))]),
            _ => {
                *seen.lock().unwrap() += 1;
                Yield::ToolCalls(vec![(
                    "add_message".into(),
                    json!({"role": "user", "content": "after the end"}),
                )])
            }
        })
    });
    let mut t = AgentTemplate::new("prog", "m").handler(Arc::new(handler));
    t.tools = vec!["add_message".into()];
    let mut run = Run::new(t, Vec::new(), Vec::new());
    finish(run.start());
    assert_eq!(run.state().status, AgentStatus::Completed);
    assert_eq!(
        *resumed.lock().unwrap(),
        0,
        "the program ran after its end_turn"
    );
    let shown = serde_json::to_string(&run.state().message_history).unwrap();
    assert!(!shown.contains("after the end"), "{shown}");
}

#[test]
fn a_call_yielded_without_include_tool_call_runs_but_stays_out_of_the_history() {
    // Codebuff's context-pruner: set_messages with includeToolCall: false
    // replaces the history and leaves no call or result of its own.
    let handler = FnHandler(|| {
        FnProgram(|resume: Resume<'_>| match resume {
            Resume::Start { .. } => Yield::Calls(vec![
                ProgramCall {
                    include_in_history: false,
                    ..ProgramCall::new(
                        "set_messages",
                        json!({"messages": [{"role": "user", "content": "pruned"}]}),
                    )
                },
                ProgramCall::new("add_message", json!({"role": "user", "content": "kept"})),
            ]),
            Resume::ToolResults { results, .. } => {
                assert_eq!(results.len(), 2, "the program still reads every result");
                Yield::Done
            }
            Resume::StepsDone { .. } => Yield::Done,
        })
    });
    let mut t = AgentTemplate::new("prog", "m").handler(Arc::new(handler));
    t.tools = vec!["add_message".into(), "set_messages".into()];
    let mut run = Run::new(t, Vec::new(), vec![Message::user("old")]);
    finish(run.start());
    assert_eq!(run.state().status, AgentStatus::Completed);
    let h = run.history();
    let names: Vec<String> = h
        .iter()
        .flat_map(|m| {
            m.tool_calls()
                .map(|c| c.tool_name.clone())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!names.contains(&"set_messages".to_string()), "{h:?}");
    assert!(
        !h.iter()
            .any(|m| m.answers().is_some_and(|id| id.ends_with("-0"))),
        "the hidden call's result is in the history: {h:?}"
    );
    assert!(!h.iter().any(|m| m.text() == "old"), "{h:?}");
    assert!(h.iter().any(|m| m.text() == "kept"), "{h:?}");
}

#[test]
fn step_text_puts_the_text_in_the_history_as_a_step_without_a_model_call() {
    let handler = FnHandler(|| {
        let mut said = false;
        FnProgram(move |resume: Resume<'_>| match resume {
            Resume::Start { .. } => Yield::StepText("I already know the answer".into()),
            Resume::StepsDone { turn_ended, .. } if !said => {
                assert!(!turn_ended);
                said = true;
                Yield::Done
            }
            _ => Yield::Fail("resumed twice".into()),
        })
    });
    let mut run = Run::solo(
        AgentTemplate::new("prog", "m")
            .max_steps(4)
            .handler(Arc::new(handler)),
    );
    finish(run.start());
    assert_eq!(run.state().status, AgentStatus::Completed);
    assert_eq!(run.state().steps_remaining, 3, "STEP_TEXT spends a step");
    assert_eq!(
        run.history().last().map(|m| (m.role(), m.text())),
        Some(("assistant", "I already know the answer".to_string()))
    );
}

#[test]
fn a_program_that_fails_fails_its_run_with_the_program_kind() {
    let handler = FnHandler(|| {
        FnProgram(|_: Resume<'_>| Yield::Fail("handleSteps failed: p.ts:3: TypeError: x".into()))
    });
    let mut run = Run::solo(AgentTemplate::new("prog", "m").handler(Arc::new(handler)));
    finish(run.start());
    assert_eq!(run.state().status, AgentStatus::Failed);
    assert_eq!(run.state().error_kind, Some(FailureKind::Program));
    assert_eq!(
        run.state().error_message(),
        Some("handleSteps failed: p.ts:3: TypeError: x")
    );
}
